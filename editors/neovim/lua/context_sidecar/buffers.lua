---Read-only scratch buffers for expansions and the session list.
local M = {}

---Show `lines` in a read-only scratch buffer called `name`, reusing it if it is open.
---@param name string
---@param lines string[]
---@return integer bufnr
function M.show(name, lines)
  local bufnr = vim.fn.bufnr(name)
  if bufnr == -1 then
    bufnr = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_name(bufnr, name)
  end
  local bo = vim.bo[bufnr]
  bo.buftype = 'nofile'
  bo.bufhidden = 'hide'
  bo.swapfile = false
  bo.modifiable = true
  bo.readonly = false
  vim.api.nvim_buf_set_lines(bufnr, 0, -1, false, lines)
  bo.modifiable = false
  bo.readonly = true
  bo.filetype = 'markdown'
  local win = vim.fn.bufwinid(bufnr)
  if win == -1 then
    vim.cmd('split')
    vim.api.nvim_win_set_buf(0, bufnr)
  else
    vim.api.nvim_set_current_win(win)
  end
  return bufnr
end

---@param message table
---@return string[]
local function message_lines(message)
  local parts = {}
  if type(message.content) == 'string' then
    table.insert(parts, message.content)
  elseif type(message.content) == 'table' then
    for _, part in ipairs(message.content) do
      table.insert(parts, part.type == 'text' and (part.text or '') or ('[' .. tostring(part.type) .. ']'))
    end
  end
  for _, call in ipairs(type(message.tool_calls) == 'table' and message.tool_calls or {}) do
    table.insert(parts, string.format('→ %s(%s)', call['function'].name, call['function'].arguments))
  end
  return vim.split(table.concat(parts, '\n'), '\n', { plain = true })
end

---Markdown lines of a `memory/expand` result.
---@param session_id string
---@param result table
---@return string[]
function M.expansion_lines(session_id, result)
  local lines = {
    string.format('# %s %s', result.kind, result.id),
    '',
    string.format('Session `%s`, %d items.', session_id, #result.items),
    '',
  }
  for _, item in ipairs(result.items) do
    local message = type(item.message) == 'table' and item.message or nil
    local role = message and (' ' .. message.role) or ''
    local tool = message and type(message.tool_call_id) == 'string' and (' (result of ' .. message.tool_call_id .. ')') or ''
    table.insert(lines, string.format('## %s%s %s%s · %d tokens', item.kind, role, item.id, tool, item.tokens))
    table.insert(lines, '')
    vim.list_extend(lines, message and message_lines(message) or vim.split(item.summary or '', '\n', { plain = true }))
    table.insert(lines, '')
  end
  if result.truncated then
    table.insert(lines, '_Truncated at the token cap._')
  end
  return lines
end

---Markdown lines of the `memory/sessions` list, newest first.
---@param sessions ContextSidecarSessionInfo[]
---@param selected string|nil
---@return string[]
function M.session_lines(sessions, selected)
  local lines = { '# Context Sidecar sessions', '' }
  if #sessions == 0 then
    table.insert(lines, 'No sessions stored yet.')
    return lines
  end
  local sorted = vim.deepcopy(sessions)
  table.sort(sorted, function(a, b)
    return a.updatedAt > b.updatedAt
  end)
  table.insert(lines, '| | session | title | messages | summaries | tokens | updated |')
  table.insert(lines, '|---|---|---|---:|---:|---:|---|')
  for _, s in ipairs(sorted) do
    local title = type(s.title) == 'string' and s.title:gsub('|', '\\|') or ''
    table.insert(lines, string.format('| %s | `%s` | %s | %d | %d | %d | %s |',
      s.sessionId == selected and '●' or '', s.sessionId, title, s.messages, s.summaries, s.tokens, s.updatedAt))
  end
  return lines
end

return M

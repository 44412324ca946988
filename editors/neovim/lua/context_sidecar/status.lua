---Usage per session, which session is shown, and the statusline text.
local M = {}

---@type table<string, ContextSidecarUsage>
M.usages = {}
---Notifications received per session: a reply to `context/usage` is only taken if none came
---while it was on its way, since the reply may describe an older state.
---@type table<string, integer>
M.versions = {}
---@type string|nil
M.selected = nil
M.pinned = false
M.running = false

---What to do, per state, in Neovim's terms. The server's own `hint` says "type /compact", a chat
---command, so it is not shown.
local hints = {
  suggest = ':ContextCompact to free up context',
  compact = ':ContextCompact now',
  overflow = ':ContextCompact, or older messages are dropped',
}

local function changed()
  vim.schedule(function()
    vim.cmd('redrawstatus!')
    vim.api.nvim_exec_autocmds('User', { pattern = 'ContextSidecarUsage', modeline = false })
  end)
end

---@param session_id string|nil
local function select(session_id)
  if session_id ~= M.selected then
    M.selected = session_id
    changed()
  end
end

function M.reset()
  M.usages = {}
  M.versions = {}
  M.selected = nil
  M.pinned = false
end

---@param session_id string
---@return integer
function M.version(session_id)
  return M.versions[session_id] or 0
end

---Record a usage pushed with `context/didChangeUsage`.
---@param usage ContextSidecarUsage
function M.notified(usage)
  M.versions[usage.sessionId] = M.version(usage.sessionId) + 1
  M.update(usage)
end

---Record a usage from a `context/usage` reply, unless a notification overtook it.
---@param usage ContextSidecarUsage
---@param version integer `version(sessionId)` when the request was sent
function M.update_from_reply(usage, version)
  if M.version(usage.sessionId) == version then
    M.update(usage)
  end
end

---Record a usage; unpinned, the selection follows the session that changed last.
---@param usage ContextSidecarUsage
function M.update(usage)
  M.usages[usage.sessionId] = usage
  if not M.pinned then
    M.selected = usage.sessionId
  end
  if usage.sessionId == M.selected then
    changed()
  end
end

---Pin a session; nil goes back to following the most recently updated one.
---@param session_id string|nil
function M.pin(session_id)
  M.pinned = session_id ~= nil
  select(session_id)
end

---Unless pinned, select the session with the newest `updatedAt` (ISO 8601, so it sorts as text).
---@param sessions ContextSidecarSessionInfo[]
function M.adopt_default(sessions)
  if M.pinned then
    return
  end
  local best
  for _, session in ipairs(sessions) do
    if not best or session.updatedAt > best.updatedAt then
      best = session
    end
  end
  if best then
    select(best.sessionId)
  end
end

---@param session_id string
function M.forget(session_id)
  M.usages[session_id] = nil
  if session_id == M.selected then
    M.selected = nil
    M.pinned = false
    changed()
  end
end

---@return ContextSidecarUsage|nil
function M.current()
  return M.selected and M.usages[M.selected] or nil
end

---What to do in this state, e.g. `:ContextCompact now`; nil for `ok` and `compacting`.
---@param usage ContextSidecarUsage
---@return string|nil
function M.short_hint(usage)
  return hints[usage.state]
end

---`ctx 72% suggest: :ContextCompact to free up context`, `ctx 80% compacting…`, `ctx 12%`.
---@param usage ContextSidecarUsage|nil
---@return string
function M.format(usage)
  if not usage then
    return 'ctx –'
  end
  local text = string.format('ctx %d%%', math.floor(usage.percent + 0.5))
  if usage.state == 'ok' then
    return text
  end
  if usage.state == 'compacting' then
    return text .. ' compacting…'
  end
  local hint = M.short_hint(usage)
  return hint and string.format('%s %s: %s', text, usage.state, hint) or (text .. ' ' .. usage.state)
end

---`prompt cache hit rate 80% last call, 64% smoothed`; nil when the server sent neither figure.
---@param usage ContextSidecarUsage
---@return string|nil
function M.cache_text(usage)
  local parts = {}
  -- JSON null arrives as vim.NIL, hence the type checks.
  if type(usage.cacheHitRate) == 'number' then
    table.insert(parts, string.format('%d%% last call', math.floor(usage.cacheHitRate * 100 + 0.5)))
  end
  if type(usage.cacheHitRateSmoothed) == 'number' then
    table.insert(parts, string.format('%d%% smoothed', math.floor(usage.cacheHitRateSmoothed * 100 + 0.5)))
  end
  return #parts > 0 and ('prompt cache hit rate ' .. table.concat(parts, ', ')) or nil
end

---Statusline component; empty while the sidecar is not running.
---@return string
function M.statusline()
  if not M.running and not M.current() then
    return ''
  end
  return M.format(M.current())
end

return M

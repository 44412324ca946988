---context-sidecar for Neovim: context usage in the statusline, `/compact`, expansions.
---
---    require('context_sidecar').setup({ settings = { contextWindow = 200000 } })
---    vim.o.statusline = "%f %= %{v:lua.require'context_sidecar'.statusline()}"
local buffers = require('context_sidecar.buffers')
local client = require('context_sidecar.client')
local config = require('context_sidecar.config')
local protocol = require('context_sidecar.protocol')
local status = require('context_sidecar.status')

local methods = protocol.methods
local uv = vim.uv or vim.loop
local M = {}

---@class ContextSidecarCompaction
---@field token string workDoneToken
---@field session string
---@field request_id integer|nil
---@field progress table[] `$/progress` values received, in order
---@field done boolean
---@field err table|nil
---@field result ContextSidecarCompactResult|nil
---@field on_done fun(err: table|nil, result: ContextSidecarCompactResult|nil)|nil

---The running or last compaction.
---@type ContextSidecarCompaction|nil
M.compaction = nil
---Server capabilities `experimental.contextSidecar` of the running server.
---@type table|nil
M.server_capabilities = nil

local token_counter = 0

local function notify(message, level)
  vim.schedule(function()
    vim.notify('context-sidecar: ' .. message, level or vim.log.levels.INFO)
  end)
end

---@param err table
---@return string
local function describe_error(err)
  return string.format('%s (%s)', err.message or vim.inspect(err), tostring(err.code))
end

---@return table|nil client, string|nil session_id
local function client_and_session()
  local c = client.get()
  if not c then
    notify('not running; run :ContextRestart', vim.log.levels.ERROR)
    return nil, nil
  end
  if not status.selected then
    notify('no session yet: an agent has to ingest messages first', vim.log.levels.WARN)
    return c, nil
  end
  return c, status.selected
end

local function on_progress(err, result, ctx, cfg)
  local compaction = M.compaction
  if compaction and result and result.token == compaction.token then
    table.insert(compaction.progress, result.value)
    local value = result.value or {}
    if config.options.notify_progress and value.kind ~= 'end' and (value.message or value.title) then
      notify(string.format('compacting: %s', value.message or value.title))
    end
  end
  -- The default handler keeps client.messages.progress, which progress statuslines read.
  local default = vim.lsp.handlers['$/progress']
  if default then
    pcall(default, err, result, ctx, cfg)
  end
end

local handlers = {
  [methods.CONTEXT_DID_CHANGE_USAGE] = function(_, usage)
    if type(usage) == 'table' and usage.sessionId then
      status.notified(usage)
    end
  end,
  [methods.CONTEXT_DID_COMPACT] = function(_, params)
    if type(params) == 'table' and params.sessionId == status.selected and params.trigger == 'auto' then
      notify(string.format('context compacted automatically: %d → %d tokens', params.tokensBefore, params.tokensAfter))
    end
    vim.schedule(function()
      vim.api.nvim_exec_autocmds('User', { pattern = 'ContextSidecarCompacted', modeline = false })
    end)
  end,
  ['$/progress'] = on_progress,
}

---Re-read the default session and the selected session's usage.
function M.refresh()
  local c = client.get()
  if not c then
    return
  end
  client.call(c, 'request', methods.MEMORY_SESSIONS, vim.empty_dict(), function(err, result)
    if err or type(result) ~= 'table' then
      return
    end
    status.adopt_default(result.sessions or {})
    local session = status.selected
    if session then
      local version = status.version(session)
      client.call(c, 'request', methods.CONTEXT_USAGE, { sessionId = session }, function(uerr, usage)
        -- A pinned session is unknown to the server until its first ingest: -32001 is expected.
        if not uerr and type(usage) == 'table' then
          status.update_from_reply(usage, version)
        end
      end)
    end
  end)
end

local callbacks = {
  handlers = handlers,
  on_init = function(_, result)
    status.running = true
    local caps = result and result.capabilities and result.capabilities.experimental
    M.server_capabilities = caps and caps[protocol.EXPERIMENTAL_KEY] or nil
    vim.schedule(M.refresh)
  end,
  on_exit = function()
    status.running = false
    if M.compaction and not M.compaction.done then
      M.compaction.done = true
      M.compaction.err = { code = protocol.errors.INTERNAL_ERROR, message = 'the server exited' }
    end
    vim.cmd('redrawstatus!')
  end,
}

---Configure and (unless `autostart = false`) start the sidecar.
---@param opts ContextSidecarOptions|table|nil
function M.setup(opts)
  local options = config.apply(opts)
  if options.session then
    status.pin(options.session)
  end
  if client.get() then
    client.send_settings(options.settings)
  elseif options.autostart then
    M.start()
  end
end

---@return integer|nil client id
function M.start()
  return client.start(config.options, callbacks)
end

function M.stop()
  client.stop()
  status.running = false
end

function M.restart()
  client.restart(config.options)
end

---The running LSP client.
---@return table|nil
function M.client()
  return client.get()
end

---A request to the sidecar, waiting for the answer (see `client.request_sync`).
---@param method string
---@param params table
---@param timeout_ms integer|nil
---@return table|nil response `{err, result}`, string|nil error
function M.request_sync(method, params, timeout_ms)
  local c = client.get()
  if not c then
    return nil, 'context-sidecar is not running'
  end
  return client.call(c, 'request_sync', method, params, timeout_ms or 10000)
end

---Statusline component, e.g. `ctx 72% suggest: type /compact to free up context`.
---@return string
function M.statusline()
  return status.statusline()
end

---The selected session's latest usage.
---@return ContextSidecarUsage|nil
function M.usage()
  return status.current()
end

---Show this session; nil follows the most recently updated one again.
---@param session_id string|nil
function M.set_session(session_id)
  status.pin(session_id ~= '' and session_id or nil)
  M.refresh()
end

---Replace the protocol settings and send them to the running server.
---@param settings table
function M.set_settings(settings)
  config.options.settings = vim.deepcopy(settings)
  client.send_settings(config.options.settings)
end

---Record the end of a compaction, once, and tell the user.
---@param compaction ContextSidecarCompaction
---@param err table|nil
---@param result ContextSidecarCompactResult|nil
local function finish(compaction, err, result)
  if compaction.done then
    return
  end
  compaction.done = true
  compaction.err = err
  compaction.result = result
  if err then
    if err.code == protocol.errors.REQUEST_CANCELLED then
      notify('compaction cancelled; the session is unchanged')
    else
      notify('compaction failed: ' .. describe_error(err), vim.log.levels.ERROR)
    end
  elseif result.compacted then
    notify(string.format('compacted %s: %d → %d tokens', compaction.session, result.tokensBefore, result.tokensAfter))
  else
    notify('nothing compacted: ' .. tostring(result.reason or 'nothing to compact'))
  end
  if compaction.on_done then
    compaction.on_done(err, result)
  end
end

---`context/compact` on the selected session, with `$/progress` on a fresh workDoneToken.
---@param opts {focus: string|nil, mode: string|nil, on_done: fun(err: table|nil, result: ContextSidecarCompactResult|nil)|nil}|nil
---@return ContextSidecarCompaction|nil
function M.compact(opts)
  opts = opts or {}
  local c, session = client_and_session()
  if not c or not session then
    return nil
  end
  if M.compaction and not M.compaction.done then
    notify('a compaction is already running; :ContextCompactCancel stops it', vim.log.levels.WARN)
    return nil
  end
  token_counter = token_counter + 1
  ---@type ContextSidecarCompaction
  local compaction = {
    token = string.format('contextSidecar/compact/%d/%d', vim.fn.getpid(), token_counter),
    session = session,
    progress = {},
    done = false,
    on_done = opts.on_done,
  }
  M.compaction = compaction
  local focus = opts.focus and vim.trim(opts.focus) or ''
  local params = {
    sessionId = session,
    mode = opts.mode,
    focus = focus ~= '' and focus or nil,
    workDoneToken = compaction.token,
  }
  local ok, request_id = client.call(c, 'request', methods.CONTEXT_COMPACT, params, function(err, result)
    finish(compaction, err, result)
  end)
  if not ok then
    compaction.done = true
    notify('could not send context/compact', vim.log.levels.ERROR)
    return nil
  end
  compaction.request_id = request_id
  return compaction
end

---Cancel the running compaction (`$/cancelRequest`); the server answers -32800.
---Neovim's RPC layer drops a -32800 reply before it reaches the request's handler, so the
---end is seen as the request leaving `client.requests` with no result handled.
---@param timeout_ms integer|nil how long to wait for the server's answer (default 30 s)
---@return boolean sent
function M.cancel(timeout_ms)
  local c = client.get()
  local compaction = M.compaction
  if not c or not compaction or compaction.done or not compaction.request_id then
    notify('no compaction is running')
    return false
  end
  client.call(c, 'cancel_request', compaction.request_id)
  local deadline = uv.now() + (timeout_ms or 30000)
  local timer = uv.new_timer()
  timer:start(20, 20, vim.schedule_wrap(function()
    if timer:is_closing() then
      return
    end
    local answered = type(c.requests) ~= 'table' or c.requests[compaction.request_id] == nil
    if not compaction.done and not answered and uv.now() < deadline then
      return
    end
    timer:stop()
    timer:close()
    -- A result that raced the cancellation is already queued: let its handler run first.
    vim.schedule(function()
      finish(compaction, {
        code = protocol.errors.REQUEST_CANCELLED,
        message = answered and 'cancelled' or 'cancelled; the server did not confirm in time',
      }, nil)
    end)
  end))
  return true
end

---Echo the selected session's usage.
function M.show_usage()
  local c, session = client_and_session()
  if not c or not session then
    return
  end
  local version = status.version(session)
  client.call(c, 'request', methods.CONTEXT_USAGE, { sessionId = session }, function(err, usage)
    if err then
      notify(describe_error(err), vim.log.levels.ERROR)
      return
    end
    status.update_from_reply(usage, version)
    notify(string.format('%s · session %s · %d of %d tokens (%s) · threshold %d · %d messages, %d summaries',
      status.format(usage), session, usage.tokens, usage.contextWindow, usage.source, usage.threshold,
      usage.messages, usage.summaries))
  end)
end

---List the stored sessions in a read-only buffer.
---@param on_done fun(bufnr: integer)|nil
function M.show_sessions(on_done)
  local c = client.get()
  if not c then
    notify('not running; run :ContextRestart', vim.log.levels.ERROR)
    return
  end
  client.call(c, 'request', methods.MEMORY_SESSIONS, vim.empty_dict(), function(err, result)
    if err then
      notify(describe_error(err), vim.log.levels.ERROR)
      return
    end
    local bufnr = buffers.show('context-sidecar://sessions', buffers.session_lines(result.sessions, status.selected))
    if on_done then
      on_done(bufnr)
    end
  end)
end

---Open `memory/expand` of a summary or pruned message in a read-only buffer.
---@param id string
---@param on_done fun(bufnr: integer|nil, err: table|nil)|nil
function M.expand(id, on_done)
  local c, session = client_and_session()
  if not c or not session then
    return
  end
  client.call(c, 'request', methods.MEMORY_EXPAND, { sessionId = session, id = id }, function(err, result)
    if err then
      notify(describe_error(err), vim.log.levels.ERROR)
      if on_done then
        on_done(nil, err)
      end
      return
    end
    local bufnr = buffers.show('context-sidecar://expand/' .. result.id, buffers.expansion_lines(session, result))
    if on_done then
      on_done(bufnr, nil)
    end
  end)
end

---Session ids known from usage notifications, for command completion.
---@return string[]
function M.known_sessions()
  local ids = vim.tbl_keys(status.usages)
  table.sort(ids)
  return ids
end

return M

---`context/compact` with progress on a workDoneToken, and its cancellation.
local client = require('context_sidecar.client')
local config = require('context_sidecar.config')
local protocol = require('context_sidecar.protocol')
local util = require('context_sidecar.util')

local uv = vim.uv or vim.loop
local notify = util.notify
local methods = protocol.methods
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
M.current = nil
local token_counter = 0

---`$/progress` handler: records the values on our token, then lets the default handler keep
---`client.messages.progress`, which progress statuslines read.
function M.on_progress(err, result, ctx, cfg)
  local compaction = M.current
  if compaction and result and result.token == compaction.token then
    table.insert(compaction.progress, result.value)
    local value = result.value or {}
    if config.options.notify_progress and value.kind ~= 'end' and (value.message or value.title) then
      notify(string.format('compacting: %s', value.message or value.title))
    end
  end
  local default = vim.lsp.handlers['$/progress']
  if default then
    pcall(default, err, result, ctx, cfg)
  end
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
      notify('compaction failed: ' .. util.describe_error(err), vim.log.levels.ERROR)
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

---Send `context/compact` for `session` with a fresh workDoneToken.
---@param c table the LSP client
---@param session string
---@param opts {focus: string|nil, mode: string|nil, on_done: fun(err: table|nil, result: ContextSidecarCompactResult|nil)|nil}
---@return ContextSidecarCompaction|nil
function M.start(c, session, opts)
  if M.current and not M.current.done then
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
  M.current = compaction
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
---@param c table|nil the LSP client
---@param timeout_ms integer|nil how long to wait for the server's answer (default 30 s)
---@return boolean sent
function M.cancel(c, timeout_ms)
  local compaction = M.current
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

---The server went away: a running compaction ends with it.
function M.server_exited()
  local compaction = M.current
  if compaction and not compaction.done then
    compaction.done = true
    compaction.err = { code = protocol.errors.INTERNAL_ERROR, message = 'the server exited' }
  end
end

return M

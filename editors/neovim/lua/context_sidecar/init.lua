---context-sidecar for Neovim: context usage in the statusline, `:ContextCompact`, expansions.
---
---    require('context_sidecar').setup({ settings = { contextWindow = 200000 } })
---    vim.o.statusline = "%f %= %{v:lua.require'context_sidecar'.statusline()}"
local buffers = require('context_sidecar.buffers')
local client = require('context_sidecar.client')
local compaction = require('context_sidecar.compaction')
local config = require('context_sidecar.config')
local follow = require('context_sidecar.follow')
local protocol = require('context_sidecar.protocol')
local status = require('context_sidecar.status')
local util = require('context_sidecar.util')

local methods = protocol.methods
local notify, describe_error = util.notify, util.describe_error
local M = {}

---Server capabilities `experimental.contextSidecar` of the running server.
---@type table|nil
M.server_capabilities = nil
---`serverInfo` of the running server's `initialize` reply: `{name, version}`.
---@type table|nil
M.server_info = nil

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
  ['$/progress'] = compaction.on_progress,
}

---@param method string
---@return boolean
local function serves(method)
  local caps = M.server_capabilities
  return caps ~= nil and type(caps.methods) == 'table' and vim.tbl_contains(caps.methods, method)
end

---The workspace whose sessions are followed: `root_dir` unless `follow_workspace` is off, or the
---server predates `context/follow`.
---@return string|nil
function M.workspace()
  if not config.options.follow_workspace or not serves(methods.CONTEXT_FOLLOW) then
    return nil
  end
  return config.root_dir(config.options)
end

---The workspace whose agent transcripts the server follows (`memory/watch`): `root_dir` unless
---`watch_agents` is off, or the server predates `memory/watch`.
---@return string|nil
function M.watched()
  if not config.options.watch_agents or not serves(methods.MEMORY_WATCH) then
    return nil
  end
  return config.root_dir(config.options)
end

---The last `memory/watch` result: the agent transcripts the server follows for `root_dir`.
---@type table|nil
M.watching = nil

---Follow the workspace (unless `follow_workspace` is off) and the pinned session, if any, and have the server
---follow the workspace's agent transcripts (unless `watch_agents` is off).
---@return boolean changed whether the followed workspace changed
local function apply_follows()
  local c = client.get()
  if not c then
    return false
  end
  follow.watch(c, M.watched(), function(result)
    M.watching = result
  end)
  if not serves(methods.CONTEXT_FOLLOW) then
    return false
  end
  follow.session(c, status.pinned and status.selected or nil)
  return follow.workspace(c, M.workspace())
end

---Re-read the default session (the newest of the followed workspace) and the selected session's usage.
function M.refresh()
  local c = client.get()
  if not c then
    return
  end
  local workspace = M.workspace()
  local params = workspace and { workspace = workspace } or vim.empty_dict()
  client.call(c, 'request', methods.MEMORY_SESSIONS, params, function(err, result)
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
    M.server_info = result and result.serverInfo or nil
    follow.reset() -- a new connection follows nothing yet
    vim.schedule(function()
      apply_follows()
      M.refresh()
    end)
  end,
  on_exit = function()
    status.running = false
    compaction.server_exited()
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
    if apply_follows() then
      M.refresh()
    end
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

---Statusline component, e.g. `ctx 72% suggest: :ContextCompact to free up context`.
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
  apply_follows()
  M.refresh()
end

---Replace the protocol settings and send them to the running server.
---@param settings table
function M.set_settings(settings)
  config.options.settings = vim.deepcopy(settings)
  client.send_settings(config.options.settings)
end

---`context/compact` on the selected session, with `$/progress` on a fresh workDoneToken.
---@param opts {focus: string|nil, mode: string|nil, on_done: fun(err: table|nil, result: ContextSidecarCompactResult|nil)|nil}|nil
---@return ContextSidecarCompaction|nil
function M.compact(opts)
  local c, session = client_and_session()
  if not c or not session then
    return nil
  end
  return compaction.start(c, session, opts or {})
end

---Cancel the running compaction (`$/cancelRequest`).
---@return boolean sent
function M.cancel()
  return compaction.cancel(client.get())
end

---The running or last compaction: `{token, session, request_id, progress, done, err, result}`.
---@return ContextSidecarCompaction|nil
function M.compaction()
  return compaction.current
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
    local cache = status.cache_text(usage)
    notify(string.format('%s · session %s · %d of %d tokens (%s) · threshold %d · %d messages, %d summaries%s',
      status.format(usage), session, usage.tokens, usage.contextWindow, usage.source, usage.threshold,
      usage.messages, usage.summaries, cache and (' · ' .. cache) or ''))
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

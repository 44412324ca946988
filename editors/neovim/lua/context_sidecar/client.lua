---Starting, restarting and stopping the sidecar as a Neovim LSP client (0.7+).
local config = require('context_sidecar.config')
local protocol = require('context_sidecar.protocol')

local M = {}
local uv = vim.uv or vim.loop

-- Neovim 0.11 made the client's functions methods (`client:request(...)`); before, they take no self.
local methods_take_self = vim.fn.has('nvim-0.11') == 1
M.methods_take_self = methods_take_self
---How the server starts. 0.11 deprecates vim.lsp.start_client for vim.lsp.start with `attach = false`,
---which keeps the sidecar off the buffers; vim.lsp.start on 0.8–0.10 would attach it to the current one.
M.start_api = vim.fn.has('nvim-0.11') == 1 and 'vim.lsp.start' or 'vim.lsp.start_client'

---Call a function of an LSP client, whichever convention this Neovim uses.
---@param c table the client
---@param name string 'request', 'request_sync', 'notify', 'cancel_request', 'stop', 'is_stopped'
function M.call(c, name, ...)
  if methods_take_self then
    return c[name](c, ...)
  end
  return c[name](...)
end

---@type integer|nil
M.client_id = nil
---How the last server process ended.
---@type {code: integer, signal: integer}|nil
M.last_exit = nil
---@type integer[] times (ms) of unexpected exits within the restart window
local crashes = {}
---Ids of clients stopped on purpose, whose exit is no crash.
---@type table<integer, true>
local stopped = {}

---@class ContextSidecarCallbacks
---@field handlers table<string, function>
---@field on_init fun(client: table, result: table)
---@field on_exit fun(code: integer, signal: integer)

---@type ContextSidecarCallbacks|nil
local callbacks = nil

---@return table|nil
function M.get()
  return M.client_id and vim.lsp.get_client_by_id(M.client_id) or nil
end

local function capabilities()
  local caps = vim.lsp.protocol.make_client_capabilities()
  caps.experimental = caps.experimental or {}
  caps.experimental[protocol.EXPERIMENTAL_KEY] = { usageNotifications = true, compactionHooks = false }
  return caps
end

---@param opts ContextSidecarOptions
---@return table
local function lsp_config(opts)
  return {
    name = protocol.SERVER_NAME,
    cmd = config.server_cmd(opts.cmd),
    cmd_env = opts.cmd_env,
    root_dir = config.root_dir(opts),
    init_options = config.json_object(opts.settings),
    -- Answers the server's workspace/configuration pull through the default handler.
    settings = { [protocol.SETTINGS_SECTION] = config.json_object(opts.settings) },
    capabilities = capabilities(),
    handlers = callbacks.handlers,
    on_init = function(client, result)
      callbacks.on_init(client, result)
    end,
    on_exit = function(code, signal, client_id)
      M.last_exit = { code = code, signal = signal }
      local intended = stopped[client_id] ~= nil
      stopped[client_id] = nil
      local current = client_id == M.client_id
      if current then
        M.client_id = nil
      end
      -- The exit of a client stopped earlier can arrive after its successor started.
      if current then
        vim.schedule(function()
          callbacks.on_exit(code, signal)
          if not intended then
            M.after_crash(code, signal)
          end
        end)
      end
    end,
  }
end

---Start the server unless it runs; returns the client id.
---@param opts ContextSidecarOptions
---@param cbs ContextSidecarCallbacks
---@return integer|nil
function M.start(opts, cbs)
  callbacks = cbs
  if M.get() then
    return M.client_id
  end
  local cfg = lsp_config(opts)
  local ok, id
  if M.start_api == 'vim.lsp.start' then
    ok, id = pcall(vim.lsp.start, cfg, { attach = false, reuse_client = function() return false end })
  else
    ok, id = pcall(vim.lsp.start_client, cfg)
  end
  if not ok or not id then
    vim.notify(
      string.format('context-sidecar: cannot start %s: %s. Set `cmd` in setup().', table.concat(cfg.cmd, ' '), tostring(id)),
      vim.log.levels.ERROR
    )
    return nil
  end
  M.client_id = id
  return id
end

---Restart after an unexpected exit, at most `restart.limit` times within `restart.window_ms`.
---@param code integer
---@param signal integer
function M.after_crash(code, signal)
  local opts = config.options
  local now = uv.now()
  local recent = {}
  for _, t in ipairs(crashes) do
    if now - t <= opts.restart.window_ms then
      table.insert(recent, t)
    end
  end
  crashes = recent
  if #crashes >= opts.restart.limit then
    vim.notify(
      string.format(
        'context-sidecar exited (code %s, signal %s) %d times within %ds; not restarting. Run :ContextRestart.',
        code, signal, #crashes + 1, math.floor(opts.restart.window_ms / 1000)
      ),
      vim.log.levels.ERROR
    )
    return
  end
  table.insert(crashes, now)
  vim.notify(string.format('context-sidecar exited (code %s, signal %s); restarting', code, signal), vim.log.levels.WARN)
  M.start(opts, callbacks)
end

---`shutdown` then `exit`; waits up to `timeout_ms` for the process to go.
---@param timeout_ms integer|nil
function M.stop(timeout_ms)
  local client = M.get()
  if not client then
    return
  end
  stopped[client.id] = true
  M.call(client, 'stop')
  vim.wait(timeout_ms or 3000, function()
    return M.call(client, 'is_stopped')
  end, 20)
  if not M.call(client, 'is_stopped') then
    M.call(client, 'stop', true)
  end
  M.client_id = nil
end

---Stop, forget earlier crashes, and start again.
---@param opts ContextSidecarOptions
function M.restart(opts)
  M.stop()
  crashes = {}
  M.start(opts, callbacks)
end

---Send the current settings as `workspace/didChangeConfiguration`.
---@param settings table
function M.send_settings(settings)
  local client = M.get()
  if client then
    client.config.settings = { [protocol.SETTINGS_SECTION] = config.json_object(settings) }
    M.call(client, 'notify', 'workspace/didChangeConfiguration', { settings = client.config.settings })
  end
end

return M

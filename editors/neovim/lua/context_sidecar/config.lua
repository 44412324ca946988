---Options of `require('context_sidecar').setup()`.
local M = {}

---@class ContextSidecarRestartOptions
---@field limit integer most restarts of a crashed server within `window_ms`
---@field window_ms integer

---@class ContextSidecarOptions
---@field cmd string[] command line of the server; `--stdio` is added if absent
---@field cmd_env table<string, string>|nil extra environment, e.g. the variable named by `llm.apiKeyEnv`
---@field root_dir string|nil workspace root sent to the server (its new sessions are tagged with it); default: cwd
---@field settings table protocol Settings (contextWindow, compaction, prune, llm, storage), sent as initializationOptions
---@field autostart boolean start the server on setup()
---@field session string|nil session to show; nil follows the most recently updated one
---@field follow_workspace boolean follow every session of `root_dir` (`context/follow`), also those other clients such as an agent ingest
---@field restart ContextSidecarRestartOptions
---@field notify_progress boolean echo compaction progress with vim.notify

---@type ContextSidecarOptions
M.defaults = {
  cmd = { 'context-sidecar' },
  cmd_env = nil,
  root_dir = nil,
  settings = {},
  autostart = true,
  session = nil,
  follow_workspace = true,
  restart = { limit = 4, window_ms = 180000 },
  notify_progress = true,
}

---@type ContextSidecarOptions
M.options = vim.deepcopy(M.defaults)

---Merge user options over the defaults; `settings` is taken as given, the server owns its defaults.
---@param opts table|nil
---@return ContextSidecarOptions
function M.apply(opts)
  opts = opts or {}
  local settings = opts.settings
  local merged = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts)
  merged.settings = settings and vim.deepcopy(settings) or {}
  if type(merged.cmd) == 'string' then
    merged.cmd = { merged.cmd }
  end
  M.options = merged
  return merged
end

---The workspace root sent to the server: `root_dir`, else the working directory.
---@param opts ContextSidecarOptions
---@return string
function M.root_dir(opts)
  return opts.root_dir or (vim.uv or vim.loop).cwd()
end

---@param cmd string[]
---@return string[]
function M.server_cmd(cmd)
  local full = vim.deepcopy(cmd)
  if not vim.tbl_contains(full, '--stdio') then
    table.insert(full, '--stdio')
  end
  return full
end

---A table that JSON-encodes as an object even when empty (an empty Lua table encodes as `[]`).
---@param t table|nil
---@return table
function M.json_object(t)
  if t == nil or next(t) == nil then
    return vim.empty_dict()
  end
  return t
end

return M

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
---@field watch_agents boolean have the server follow the transcripts Claude Code, Codex and pi write for `root_dir` (`memory/watch`)
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
  watch_agents = true,
  restart = { limit = 4, window_ms = 180000 },
  notify_progress = true,
}

---@type ContextSidecarOptions
M.options = vim.deepcopy(M.defaults)
---Whether setup() has run.
M.configured = false

-- vim.islist is 0.10+; 0.12 deprecates vim.tbl_islist.
local islist = vim.islist or vim.tbl_islist

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
  M.configured = true
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

---Every option's name, sorted; the defaults leave out those that default to nil.
---@type string[]
M.names = { 'cmd_env', 'root_dir', 'session' }
vim.list_extend(M.names, vim.tbl_keys(M.defaults))
table.sort(M.names)

---@param value any
---@return boolean
local function is_string_list(value)
  if type(value) ~= 'table' or not islist(value) or #value == 0 then
    return false
  end
  for _, item in ipairs(value) do
    if type(item) ~= 'string' then
      return false
    end
  end
  return true
end

---@param value any
---@return boolean
local function is_string_map(value)
  if type(value) ~= 'table' then
    return false
  end
  for k, v in pairs(value) do
    if type(k) ~= 'string' or type(v) ~= 'string' then
      return false
    end
  end
  return true
end

---What is wrong with `opts`, one readable line each; the protocol settings are the server's to judge.
---@param opts table
---@return string[]
function M.problems(opts)
  local problems = {}
  local function add(...)
    table.insert(problems, string.format(...))
  end
  local names = vim.tbl_keys(opts)
  table.sort(names)
  for _, name in ipairs(names) do
    if not vim.tbl_contains(M.names, name) then
      add('unknown option `%s`', name)
    end
  end
  if not is_string_list(opts.cmd) then
    add('`cmd` must be a non-empty list of strings, got %s', vim.inspect(opts.cmd))
  end
  if opts.cmd_env ~= nil and not is_string_map(opts.cmd_env) then
    add('`cmd_env` must map names to strings, got %s', vim.inspect(opts.cmd_env))
  end
  if opts.root_dir ~= nil and (type(opts.root_dir) ~= 'string' or vim.fn.isdirectory(opts.root_dir) == 0) then
    add('`root_dir` is not a directory: %s', vim.inspect(opts.root_dir))
  end
  if opts.session ~= nil and type(opts.session) ~= 'string' then
    add('`session` must be a session id (string) or nil, got %s', vim.inspect(opts.session))
  end
  for _, name in ipairs({ 'autostart', 'notify_progress', 'follow_workspace', 'watch_agents' }) do
    if type(opts[name]) ~= 'boolean' then
      add('`%s` must be true or false, got %s', name, vim.inspect(opts[name]))
    end
  end
  local restart = opts.restart
  if type(restart) ~= 'table' or type(restart.limit) ~= 'number' or restart.limit < 0
      or type(restart.window_ms) ~= 'number' or restart.window_ms <= 0 then
    add('`restart` must be { limit = n >= 0, window_ms = n > 0 }, got %s', vim.inspect(restart))
  end
  local settings = opts.settings
  if type(settings) ~= 'table' or (next(settings) ~= nil and islist(settings)) then
    add('`settings` must be a table of protocol Settings, got %s', vim.inspect(settings))
  elseif type(settings.llm) == 'table' and type(settings.llm.apiKeyEnv) == 'string' then
    local name = settings.llm.apiKeyEnv
    local env = type(opts.cmd_env) == 'table' and opts.cmd_env or {}
    if env[name] == nil and os.getenv(name) == nil then
      add('`settings.llm.apiKeyEnv` names %s, which is neither in `cmd_env` nor in the environment', name)
    end
  end
  return problems
end

return M

---`:checkhealth context_sidecar`: Neovim, the server command and its version, the running server, the options.
local client = require('context_sidecar.client')
local config = require('context_sidecar.config')
local protocol = require('context_sidecar.protocol')

local M = {}

---How long `cmd --version` may take; a Python server starts in well under a second.
local VERSION_TIMEOUT_MS = 15000

---@class ContextSidecarHealthReport
---@field start fun(name: string)
---@field ok fun(msg: string)
---@field info fun(msg: string)
---@field warn fun(msg: string, advice: string[]|nil)
---@field error fun(msg: string, advice: string[]|nil)

---vim.health.start/ok/… on 0.9+ (0.10 deprecates the report_* names); the Vimscript health#report_* on 0.7.
---@return ContextSidecarHealthReport
local function reporter()
  local health = vim.health
  if health and health.start then
    return { start = health.start, ok = health.ok, info = health.info, warn = health.warn, error = health.error }
  end
  local function vimscript(name)
    return function(msg, advice)
      if advice then
        vim.fn['health#report_' .. name](msg, advice)
      else
        vim.fn['health#report_' .. name](msg)
      end
    end
  end
  return {
    start = vimscript('start'),
    ok = vimscript('ok'),
    info = vimscript('info'),
    warn = vimscript('warn'),
    error = vimscript('error'),
  }
end

---Run `cmd` to its end or `timeout_ms`; vim.system where present (0.10+), a job on older versions.
---@param cmd string[]
---@param env table<string, string>|nil
---@param timeout_ms integer
---@return integer|nil code nil when it could not start or timed out, string output, string|nil why
local function run(cmd, env, timeout_ms)
  if vim.system then
    local ok, proc = pcall(vim.system, cmd, { text = true, env = env })
    if not ok then
      return nil, '', tostring(proc)
    end
    local result = proc:wait(timeout_ms)
    local output = vim.trim((result.stdout or '') .. (result.stderr or ''))
    if result.signal ~= 0 then
      return nil, output, string.format('killed by signal %d (no answer within %d ms?)', result.signal, timeout_ms)
    end
    return result.code, output, nil
  end
  local chunks = {}
  local function collect(_, data)
    vim.list_extend(chunks, data)
  end
  local ok, job = pcall(vim.fn.jobstart, cmd, { env = env, stdout_buffered = true, stderr_buffered = true,
    on_stdout = collect, on_stderr = collect })
  if not ok or job <= 0 then
    return nil, '', ok and 'not executable' or tostring(job)
  end
  local code = vim.fn.jobwait({ job }, timeout_ms)[1]
  if code == -1 then
    vim.fn.jobstop(job)
    return nil, '', string.format('no answer within %d ms', timeout_ms)
  end
  return code, vim.trim(table.concat(chunks, '\n')), nil
end

---@param report ContextSidecarHealthReport
local function check_neovim(report)
  report.start('Neovim')
  local v = vim.version()
  local version = string.format('%d.%d.%d', v.major, v.minor, v.patch)
  if vim.fn.has('nvim-0.7') == 0 then
    report.error('Neovim ' .. version .. ' is too old', { 'The plugin needs Neovim 0.7 or later.' })
    return
  end
  report.ok(string.format('Neovim %s (the server runs through %s; client calls as %s)', version,
    client.start_api,
    client.methods_take_self and 'methods, client:request()' or 'functions, client.request()'))
end

---@param report ContextSidecarHealthReport
---@param opts ContextSidecarOptions
local function check_server_command(report, opts)
  report.start('Server command')
  local cmd = opts.cmd
  if type(cmd) ~= 'table' or type(cmd[1]) ~= 'string' then
    report.error('`cmd` is not a command line: ' .. vim.inspect(cmd))
    return
  end
  local path = vim.fn.exepath(cmd[1])
  if path == '' then
    report.error(string.format('`%s` is not found or not executable', cmd[1]), {
      'Install the server (`pip install context-sidecar`) and put it on PATH,',
      "or pass its full path: require('context_sidecar').setup({ cmd = { '/path/to/context-sidecar' } })",
    })
    return
  end
  report.ok(string.format('`%s` found: %s', cmd[1], path))
  local line = vim.list_extend(vim.deepcopy(cmd), { '--version' })
  local code, output, why = run(line, opts.cmd_env, VERSION_TIMEOUT_MS)
  if code == 0 and output ~= '' then
    report.ok(string.format('`%s` answers: %s', table.concat(line, ' '), output))
  else
    report.error(string.format('`%s` did not answer with a version: %s', table.concat(line, ' '),
      why or string.format('exit code %d, output %s', code, vim.inspect(output))),
      { 'Run it in a terminal to see what is wrong.' })
  end
end

---@param report ContextSidecarHealthReport
local function check_running(report)
  report.start('Running server')
  local c = client.get()
  if not c then
    if not config.configured then
      report.warn("setup() has not been called, so the server is not started",
        { "Call require('context_sidecar').setup() in your config." })
    elseif client.last_exit then
      report.warn(string.format('not running; it last exited with code %s, signal %s', client.last_exit.code,
        client.last_exit.signal), { 'Run :ContextRestart; :checkhealth vim.lsp shows the LSP log.' })
    else
      report.warn('not running', { 'Run :ContextRestart.' })
    end
    return
  end
  local sidecar = require('context_sidecar')
  local info = sidecar.server_info or {}
  report.ok(string.format('running as LSP client %d: %s %s', c.id, info.name or protocol.SERVER_NAME,
    info.version or '(no version in serverInfo)'))
  local caps = sidecar.server_capabilities
  if not caps then
    report.warn('no `experimental.' .. protocol.EXPERIMENTAL_KEY .. '` capabilities (yet): is it a context-sidecar?')
  elseif caps.protocolVersion ~= protocol.PROTOCOL_VERSION then
    report.warn(string.format('the server speaks protocol version %s, the plugin %d', tostring(caps.protocolVersion),
      protocol.PROTOCOL_VERSION), { 'Update the plugin and the server together.' })
  else
    report.ok(string.format('protocol version %d', caps.protocolVersion))
  end
end

---@param report ContextSidecarHealthReport
---@param opts ContextSidecarOptions
local function check_options(report, opts)
  report.start('Options')
  local problems = config.problems(opts)
  for _, problem in ipairs(problems) do
    report.warn(problem, { ':help context_sidecar-options' })
  end
  if #problems == 0 then
    report.ok('setup() options look right')
  end
end

function M.check()
  local report = reporter()
  local opts = config.options
  check_neovim(report)
  check_server_command(report, opts)
  check_running(report)
  check_options(report, opts)
end

return M

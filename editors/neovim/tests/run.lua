-- Headless tests of the Neovim plugin against the real context-sidecar:
--   nvim --headless -u NONE -c "luafile tests/run.lua"
-- The server command comes from CONTEXT_SIDECAR_COMMAND (default: context-sidecar on PATH).
local here = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h')
local root = vim.fn.fnamemodify(here, ':h')
vim.opt.runtimepath:prepend(root)
package.path = here .. '/?.lua;' .. package.path
vim.cmd('runtime plugin/context_sidecar.lua')

local t = require('harness')
local fake_llm = require('fake_llm')
local uv = vim.uv or vim.loop

-- Every deprecated Neovim API the plugin or these tests call; the last test wants none.
-- vim.deprecate records soft deprecations too, which print nothing yet (0.7 has no vim.deprecate).
---@type table<string, {alternative: string|nil, first_call: string}>
local deprecations = {}
if vim.deprecate then
  local deprecate = vim.deprecate
  vim.deprecate = function(name, alternative, ...)
    deprecations[name] = deprecations[name] or { alternative = alternative, first_call = debug.traceback('', 2) }
    return deprecate(name, alternative, ...)
  end
end

-- A hung test must not hang the run.
vim.defer_fn(function()
  t.out('not ok - the run took longer than 240 s')
  vim.cmd('cquit 2')
end, 240000)

local notifications = {}
vim.notify = function(message, level)
  table.insert(notifications, { message = message, level = level })
end

local db_dir = vim.fn.tempname()
vim.fn.mkdir(db_dir, 'p')
local command = vim.split(vim.trim(os.getenv('CONTEXT_SIDECAR_COMMAND') or ''), '%s+', { trimempty = true })
if #command == 0 then
  command = { 'context-sidecar' }
end
-- CONTEXT_SIDECAR_NVIM_DB (editors/run-tests.sh sets it to a fresh team database's URL): the core tests on that
-- database instead of a DuckDB file of their own.
local team_db = os.getenv('CONTEXT_SIDECAR_NVIM_DB')
local db = db_dir .. '/memory.duckdb'
if team_db and team_db ~= '' then
  db = team_db
  t.only_core = 'not in the core run on a team database'
end
local cmd = vim.list_extend(vim.deepcopy(command), { '--db', db })

local SETTINGS = {
  contextWindow = 4000,
  compaction = { auto = false, maxTokens = -1, reserveTokens = 500, freshTail = 4 },
  prune = { protectTokens = 200, minimumTokens = 100 },
}

local function big_message(id, tokens)
  return { role = 'user', content = vim.trim(string.rep('word ', math.floor(tokens * 4 / 5))), id = id }
end

local function conversation(prefix)
  local messages = {}
  for i = 0, 23 do
    table.insert(messages, {
      role = i % 2 == 0 and 'user' or 'assistant',
      content = string.format('turn %d of %s: ', i, prefix) .. string.rep('we edited src/app.py and ran the tests again ', 10),
      id = prefix .. i,
    })
  end
  return messages
end

local function tool_exchange(n, output)
  return {
    { role = 'user', content = 'step ' .. n .. ': look at the files', id = 'u' .. n },
    {
      role = 'assistant',
      content = vim.NIL,
      id = 'a' .. n,
      tool_calls = { { id = 'call' .. n, type = 'function', ['function'] = { name = 'bash', arguments = '{"cmd": "ls -R"}' } } },
    },
    { role = 'tool', content = output, tool_call_id = 'call' .. n, id = 't' .. n },
    { role = 'assistant', content = 'done with step ' .. n, id = 'd' .. n },
  }
end

local function request(method, params)
  local response, err = require('context_sidecar').request_sync(method, params, 10000)
  t.ok(response, method .. ': ' .. tostring(err))
  t.ok(not response.err, method .. ': ' .. vim.inspect(response.err))
  return response.result
end

local function ingest(session, messages)
  return request('memory/ingest', { sessionId = session, messages = messages })
end

local function serves_compact()
  local caps = require('context_sidecar').server_capabilities
  return caps and vim.tbl_contains(caps.methods or {}, 'context/compact')
end

local function buffer_lines(name)
  local bufnr = vim.fn.bufnr(name)
  return bufnr, bufnr ~= -1 and vim.api.nvim_buf_get_lines(bufnr, 0, -1, false) or {}
end

local sidecar = require('context_sidecar')
local status = require('context_sidecar.status')
local client = require('context_sidecar.client')

---Live child processes of this Neovim started with the test database (a zombie has no cmdline).
---@return integer[]
local function server_pids()
  local pids = {}
  for _, pid in ipairs(vim.api.nvim_get_proc_children(vim.fn.getpid())) do
    local file = io.open('/proc/' .. pid .. '/cmdline', 'rb')
    local cmdline = file and file:read('*a') or ''
    if file then
      file:close()
    end
    if cmdline:find(db, 1, true) then
      table.insert(pids, pid)
    end
  end
  return pids
end

---The pid of the server behind client `c`: 0.11+ no longer expose it as `c.rpc.pid`, so it is
---looked up among this Neovim's children (an old server may still be on its way out).
---@param c table
---@return integer
local function server_pid(c)
  t.wait_for('exactly one server process', function()
    return #server_pids() == 1
  end)
  local pid = server_pids()[1]
  if c.rpc and c.rpc.pid then
    t.eq(pid, c.rpc.pid, 'the server process')
  end
  return pid
end

---Run `:checkhealth context_sidecar` and read its report as `{level, text}` items
---(0.7 writes `- OK: text`, 0.10+ `- ✅ OK text`).
---@return {level: string, text: string}[]
local function checkhealth()
  vim.cmd('silent checkhealth context_sidecar')
  local bufnr = vim.api.nvim_get_current_buf()
  local lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  t.ok(table.concat(lines, '\n'):find('context_sidecar', 1, true), 'not a health report: ' .. vim.inspect(lines))
  local report = {}
  for _, line in ipairs(lines) do
    local level, text = line:match('^%s*%-%s+[^%w]*(%u+):?%s+(.*)$')
    if level == 'OK' or level == 'INFO' or level == 'WARNING' or level == 'ERROR' then
      table.insert(report, { level = level, text = text })
    end
  end
  vim.cmd('bwipeout! ' .. bufnr)
  return report
end

---@return boolean whether `report` has an item of `level` whose text matches `pattern`
local function find(report, level, pattern)
  for _, item in ipairs(report) do
    if item.level == level and item.text:find(pattern) then
      return true
    end
  end
  return false
end

---The Python beside the server's entry point (a virtualenv's), else python3: the agent imports sidecar.client.
local function agent_python()
  local beside = vim.fn.fnamemodify(vim.fn.exepath(command[1]), ':h') .. '/python'
  return vim.fn.executable(beside) == 1 and beside or 'python3'
end

---A terminal agent (tests/agent.py: the Python client) on the tests' database, started in `workspace`.
local function start_agent(workspace)
  local python = agent_python()
  vim.fn.system({ python, '-c', 'import sidecar.client' })
  if vim.v.shell_error ~= 0 then
    t.skip(python .. ' cannot import sidecar.client; set CONTEXT_SIDECAR_COMMAND to a virtualenv\'s context-sidecar')
  end
  local agent = { answers = {}, ready = false, exited = nil, stderr = {} }
  local partial = ''
  local argv = vim.list_extend({ python, here .. '/agent.py', db }, vim.deepcopy(command))
  agent.job = vim.fn.jobstart(argv, {
    cwd = workspace,
    on_stdout = function(_, data)
      data[1] = partial .. data[1]
      partial = table.remove(data)
      for _, line in ipairs(data) do
        local answer = vim.fn.json_decode(line)
        if answer.ready then
          agent.ready = true
        else
          table.insert(agent.answers, answer)
        end
      end
    end,
    on_stderr = function(_, data)
      vim.list_extend(agent.stderr, data)
    end,
    on_exit = function(_, code)
      agent.exited = code
    end,
  })
  t.ok(agent.job > 0, 'cannot run ' .. table.concat(argv, ' '))
  t.wait_for('the agent to start', function()
    return agent.ready or agent.exited ~= nil
  end, 30000)
  t.ok(agent.ready, 'the agent exited: ' .. table.concat(agent.stderr, '\n'))
  function agent.request(method, params)
    local seen = #agent.answers
    vim.fn.chansend(agent.job, vim.fn.json_encode({ method = method, params = params }) .. '\n')
    t.wait_for('the agent\'s answer to ' .. method, function()
      return #agent.answers > seen or agent.exited ~= nil
    end, 20000)
    local answer = agent.answers[seen + 1]
    t.ok(answer and answer.result, method .. ': ' .. vim.inspect(answer or agent.stderr))
    return answer.result
  end
  function agent.close()
    vim.fn.chanclose(agent.job, 'stdin')
    t.wait_for('the agent to exit', function()
      return agent.exited ~= nil
    end, 15000)
    t.eq(agent.exited, 0, table.concat(agent.stderr, '\n'))
  end
  return agent
end

---The workspace of the agent's session agent-1.
---@type string|nil
local agent_workspace = nil

---Restart the plugin with the fake OpenAI-compatible endpoint `llm` as its summarizer.
local function restart_with_llm(llm)
  sidecar.stop()
  sidecar.setup({
    cmd = cmd,
    cmd_env = { CTX_SIDECAR_TEST_KEY = 'sk-test' },
    settings = vim.tbl_deep_extend('force', SETTINGS, {
      llm = { baseUrl = string.format('http://127.0.0.1:%d/v1', llm.port), model = 'fake-model',
              apiKeyEnv = 'CTX_SIDECAR_TEST_KEY' },
    }),
  })
  t.wait_for('the restarted server', function()
    return status.running and sidecar.server_capabilities ~= nil
  end)
end

---Restart the plugin on a workspace of its own, with nothing selected.
local function restart_in(workspace, opts)
  sidecar.stop()
  status.reset()
  sidecar.setup(vim.tbl_extend('force', { cmd = cmd, settings = SETTINGS, root_dir = workspace }, opts or {}))
  t.wait_for('the restarted server', function()
    return status.running and sidecar.server_capabilities ~= nil
  end)
end

local function main()
  t.test(':helptags builds the help file, and it has a tag for every command, option and function', function()
    local dir = vim.fn.tempname()
    vim.fn.mkdir(dir .. '/doc', 'p')
    vim.fn.writefile(vim.fn.readfile(root .. '/doc/context_sidecar.txt'), dir .. '/doc/context_sidecar.txt')
    local ok, err = pcall(vim.cmd, 'helptags ' .. vim.fn.fnameescape(dir .. '/doc'))
    t.ok(ok, tostring(err))
    local tags = {}
    for _, line in ipairs(vim.fn.readfile(dir .. '/doc/tags')) do
      tags[vim.split(line, '\t', { plain = true })[1]] = true
    end
    local wanted = { 'context_sidecar.txt', 'context_sidecar-options', ':checkhealth-context_sidecar' }
    for name in pairs(vim.api.nvim_get_commands({})) do
      if name:match('^Context') then
        table.insert(wanted, ':' .. name)
      end
    end
    for _, name in ipairs(require('context_sidecar.config').names) do
      table.insert(wanted, 'context_sidecar-' .. name)
    end
    for name, value in pairs(sidecar) do
      if type(value) == 'function' then
        table.insert(wanted, 'context_sidecar.' .. name .. '()')
      end
    end
    table.sort(wanted)
    local missing = vim.tbl_filter(function(tag)
      return not tags[tag]
    end, wanted)
    t.eq(missing, {}, 'tags missing from doc/context_sidecar.txt')
    vim.opt.runtimepath:append(dir)
    for tag in pairs(tags) do
      local found, why = pcall(vim.cmd, 'help ' .. tag)
      t.ok(found, tag .. ': ' .. tostring(why))
      t.eq(vim.fn.expand('%:t'), 'context_sidecar.txt', tag)
      vim.cmd('helpclose')
    end
    vim.opt.runtimepath:remove(dir)
    vim.fn.delete(dir, 'rf')
  end)

  t.core('setup() starts the sidecar and initializes', function()
    sidecar.setup({ cmd = cmd, settings = SETTINGS })
    t.wait_for('initialize', function()
      return status.running
    end)
    local caps = sidecar.server_capabilities
    t.eq(caps.protocolVersion, 1)
    t.eq(caps.storage, db, 'the storage the server opened')
    t.ok(vim.tbl_contains(caps.methods, 'memory/ingest'), vim.inspect(caps.methods))
    t.eq(sidecar.statusline(), 'ctx –')
    t.eq(vim.lsp.get_buffers_by_client_id(sidecar.client().id), {}, 'buffers the sidecar is attached to')
  end)

  t.core(':checkhealth context_sidecar finds the server, its version and a running client', function()
    local report = checkhealth()
    local text = vim.inspect(report)
    local errors = vim.tbl_filter(function(r)
      return r.level ~= 'OK' and r.level ~= 'INFO'
    end, report)
    t.eq(errors, {}, 'warnings or errors')
    t.ok(find(report, 'OK', '^Neovim %d+%.%d+%.%d+'), text)
    t.ok(find(report, 'OK', '^`' .. vim.pesc(cmd[1]) .. '` found: /'), text)
    t.ok(find(report, 'OK', 'answers: context%-sidecar %d+%.%d+'), text)
    t.ok(find(report, 'OK', '^running as LSP client %d+: context%-sidecar %d'), text)
    t.ok(find(report, 'OK', '^protocol version 1$'), text)
    t.ok(find(report, 'OK', 'options look right'), text)
  end)

  t.test(':checkhealth context_sidecar reports a missing server, one that fails, and wrong options', function()
    local config = require('context_sidecar.config')
    local saved = config.options
    t.finally(function()
      config.options = vim.tbl_extend('force', vim.deepcopy(saved), {
        cmd = { 'no-such-context-sidecar' },
        restart = { limit = -1, window_ms = 1000 },
        notify_progres = true,
        settings = { llm = { apiKeyEnv = 'CTX_SIDECAR_UNSET_KEY' } },
      })
      local report = checkhealth()
      local text = vim.inspect(report)
      t.ok(find(report, 'ERROR', '^`no%-such%-context%-sidecar` is not found'), text)
      t.ok(find(report, 'WARNING', '^unknown option `notify_progres`'), text)
      t.ok(find(report, 'WARNING', '^`restart` must be'), text)
      t.ok(find(report, 'WARNING', 'CTX_SIDECAR_UNSET_KEY, which is neither'), text)
      config.options = vim.tbl_extend('force', vim.deepcopy(saved), { cmd = { 'sh', '-c', 'echo no such flag >&2; exit 3' } })
      report = checkhealth()
      text = vim.inspect(report)
      t.ok(find(report, 'ERROR', 'did not answer with a version: exit code 3, output "no such flag"'), text)
    end, function()
      config.options = saved
    end)
  end)

  t.core('statusline moves through ok, suggest, compact and overflow', function()
    local steps = {
      { 1000, '^ctx 2%d%%$' },
      { 1900, '^ctx 7%d%% suggest: :ContextCompact to free up context$' },
      { 300, '^ctx [78]%d%% compact: :ContextCompact now$' },
      { 1200, '^ctx 1%d%d%% overflow: :ContextCompact, or older messages are dropped$' },
    }
    for i, step in ipairs(steps) do
      local result = ingest('status', { big_message('m' .. i, step[1]) })
      t.wait_for('usage of step ' .. i, function()
        local usage = sidecar.usage()
        return usage and usage.tokens == result.usage.tokens
      end)
      t.match(sidecar.statusline(), step[2], 'step ' .. i)
    end
    t.eq(sidecar.usage().state, 'overflow')
  end)

  t.core(':ContextSession pins a session; without one the latest is followed', function()
    vim.cmd('ContextSession pinned')
    t.wait_for('the pinned session', function()
      return status.selected == 'pinned'
    end)
    t.eq(sidecar.statusline(), 'ctx –')
    ingest('pinned', { big_message('p1', 500) })
    t.wait_for('pinned usage', function()
      return sidecar.statusline() == 'ctx 13%'
    end)
    local other = ingest('status', { big_message('m9', 10) })
    t.wait_for('the usage push of the other session', function()
      return status.usages.status and status.usages.status.tokens == other.usage.tokens
    end)
    t.eq(status.selected, 'pinned')
    t.eq(sidecar.statusline(), 'ctx 13%')
    sidecar.set_session(nil)
    t.wait_for('the most recently updated session', function()
      return status.selected == 'status' and sidecar.usage() ~= nil
    end)
    t.match(sidecar.statusline(), 'overflow')
  end)

  t.test('changed settings reach the server and the statusline', function()
    sidecar.set_settings(vim.tbl_deep_extend('force', SETTINGS, { contextWindow = 8000 }))
    t.wait_for('usage with the new window', function()
      local usage = sidecar.usage()
      return usage and usage.contextWindow == 8000
    end)
    local usage = sidecar.usage()
    t.eq(sidecar.statusline(), status.format(usage))
    t.eq(usage.state, 'ok')
    sidecar.set_settings(SETTINGS)
    t.wait_for('usage with the old window', function()
      return sidecar.usage().contextWindow == 4000
    end)
    local complaints = vim.tbl_filter(function(n)
      return n.message:find('settings', 1, true) ~= nil
    end, notifications)
    t.eq(complaints, {}, 'the server complained about settings')
  end)

  t.core(':ContextSessions lists sessions in a read-only buffer', function()
    vim.cmd('ContextSessions')
    t.wait_for('the sessions buffer', function()
      return vim.fn.bufnr('context-sidecar://sessions') ~= -1
    end)
    local bufnr, lines = buffer_lines('context-sidecar://sessions')
    local text = table.concat(lines, '\n')
    t.match(text, '| ● | `status` |', text)
    t.match(text, '`pinned`')
    t.eq(vim.bo[bufnr].modifiable, false)
    t.eq(vim.bo[bufnr].buftype, 'nofile')
  end)

  t.test(':ContextExpand shows a pruned tool output in full, read-only', function()
    local output = string.rep('line of a long file listing\n', 120)
    local messages = {}
    for n = 1, 3 do
      vim.list_extend(messages, tool_exchange(n, output))
    end
    ingest('docs', messages)
    sidecar.set_session('docs')
    local assembled = request('context/assemble', { sessionId = 'docs' })
    local pruned
    for _, item in ipairs(assembled.items) do
      if item.pruned then
        pruned = item
        break
      end
    end
    t.ok(pruned, 'nothing was pruned: ' .. vim.inspect(assembled.items))
    vim.cmd('ContextExpand ' .. pruned.id)
    local name = 'context-sidecar://expand/' .. pruned.id
    t.wait_for('the expansion buffer', function()
      return vim.fn.bufnr(name) ~= -1
    end)
    local bufnr, lines = buffer_lines(name)
    local text = table.concat(lines, '\n')
    t.ok(text:find(vim.trim(output), 1, true), text:sub(1, 300))
    t.match(lines[1], '^# %S+ ' .. vim.pesc(pruned.id) .. '$')
    t.eq(vim.bo[bufnr].modifiable, false)
    t.eq(vim.bo[bufnr].readonly, true)
  end)

  t.core(':ContextCompact compacts with $/progress and updates the statusline', function()
    if not serves_compact() then
      t.skip('the server does not answer context/compact yet')
    end
    local before = ingest('work', conversation('w')).usage
    sidecar.set_session('work')
    local seen = {}
    local update = status.update
    -- Every usage that reaches the statusline, whether pushed or replied.
    status.update = function(usage)
      if usage.sessionId == 'work' then
        table.insert(seen, status.format(usage))
      end
      update(usage)
    end
    vim.cmd('ContextCompact the failing tests')
    t.wait_for('the compaction', function()
      return sidecar.compaction() ~= nil and sidecar.compaction().done
    end, 30000)
    status.update = update
    local compaction = sidecar.compaction()
    t.ok(not compaction.err, vim.inspect(compaction.err))
    local result = compaction.result
    t.eq(result.compacted, true, vim.inspect(result))
    t.eq(result.tokensBefore, before.tokens)
    t.ok(result.tokensAfter < result.tokensBefore, vim.inspect(result))
    t.ok(#compaction.progress >= 2, vim.inspect(compaction.progress))
    t.eq(compaction.progress[1].kind, 'begin')
    t.eq(compaction.progress[#compaction.progress].kind, 'end')
    local ok_usage = vim.wait(10000, function()
      return sidecar.usage().tokens == result.tokensAfter
    end, 20)
    t.ok(ok_usage, 'usage after the compaction: ' .. vim.inspect({ usage = sidecar.usage(), result = result, seen = seen }))
    t.ok(vim.tbl_contains(vim.tbl_map(function(s)
      return s:match('compacting…$') ~= nil
    end, seen), true), 'no compacting state among ' .. vim.inspect(seen))
    t.eq(sidecar.statusline(), status.format(result.usage))
  end)

  t.test(':ContextCompactCancel cancels a running compaction and leaves the session as it was', function()
    if not serves_compact() then
      t.skip('the server does not answer context/compact yet')
    end
    local llm = fake_llm.start()
    t.finally(function()
      restart_with_llm(llm)
      t.eq(sidecar.server_capabilities.summarizer, 'openai')
      local before = ingest('cancel', conversation('c')).usage
      sidecar.set_session('cancel')
      vim.cmd('ContextCompact')
      t.wait_for('the summarizer request', llm.received, 15000)
      vim.cmd('ContextCompactCancel')
      t.wait_for('the cancelled reply', function()
        return sidecar.compaction().done
      end)
      t.eq(sidecar.compaction().err and sidecar.compaction().err.code, -32800, vim.inspect(sidecar.compaction().err))
      local after = request('context/usage', { sessionId = 'cancel' })
      t.eq(after.tokens, before.tokens)
      t.eq(after.summaries, 0)
      t.ok(after.state ~= 'compacting', after.state)
    end, function()
      llm.close()
    end)
  end)

  t.test(':ContextCompact tells the user when the summarizer fails', function()
    if not serves_compact() then
      t.skip('the server does not answer context/compact yet')
    end
    local llm = fake_llm.start({ status = 400 })
    t.finally(function()
      restart_with_llm(llm)
      local before = ingest('failing', conversation('f')).usage
      sidecar.set_session('failing')
      vim.cmd('ContextCompact')
      t.wait_for('the failed compaction', function()
        return sidecar.compaction().done
      end, 30000)
      t.ok(llm.received(), 'the summarizer was not asked')
      local failure = sidecar.compaction().err
      t.eq(failure and failure.code, -32010, vim.inspect(failure))
      t.wait_for('the message to the user', function()
        return #vim.tbl_filter(function(n)
          return n.message:find('compaction failed: .*%(%-32010%)$') ~= nil and n.level == vim.log.levels.ERROR
        end, notifications) == 1
      end)
      t.eq(request('context/usage', { sessionId = 'failing' }).tokens, before.tokens)
    end, function()
      llm.close()
    end)
  end)

  t.core('the statusline follows an agent\'s session of the workspace, live, and :ContextCompact compacts it', function()
    if not serves_compact() then
      t.skip('the server does not answer context/compact yet')
    end
    local workspace = vim.fn.tempname()
    vim.fn.mkdir(workspace, 'p')
    agent_workspace = workspace
    local adopt_default, listed_at_start = status.adopt_default, nil
    status.adopt_default = function(sessions)
      listed_at_start = sessions
      adopt_default(sessions)
    end
    restart_in(workspace)
    t.wait_for('the sessions listed at start', function()
      return listed_at_start ~= nil
    end)
    status.adopt_default = adopt_default
    t.eq(sidecar.workspace(), workspace)
    -- Sessions of other workspaces are in the same database; none of them is shown.
    t.eq(listed_at_start, {})
    t.eq(sidecar.statusline(), 'ctx –')
    local agent = start_agent(workspace)
    t.finally(function()
      local first = agent.request('memory/ingest', { sessionId = 'agent-1', messages = conversation('a') }).usage
      t.wait_for('the agent\'s usage in the statusline', function()
        local usage = sidecar.usage()
        return usage and usage.sessionId == 'agent-1' and usage.tokens == first.tokens
      end)
      t.eq(status.selected, 'agent-1')
      t.eq(sidecar.statusline(), status.format(first))
      t.match(sidecar.statusline(), '^ctx %d+%%')

      local second = agent.request('memory/ingest', { sessionId = 'agent-1', messages = { big_message('a-more', 300) } }).usage
      t.ok(second.tokens > first.tokens, vim.inspect({ first, second }))
      t.wait_for('the agent\'s second ingest in the statusline', function()
        return sidecar.usage().tokens == second.tokens
      end)
      t.eq(sidecar.statusline(), status.format(second))
      local listed = request('memory/sessions', { workspace = workspace }).sessions
      t.eq(vim.tbl_map(function(s)
        return s.sessionId
      end, listed), { 'agent-1' })

      vim.cmd('ContextCompact')
      t.wait_for('the compaction', function()
        return sidecar.compaction() ~= nil and sidecar.compaction().done
      end, 30000)
      local compaction = sidecar.compaction()
      t.ok(not compaction.err, vim.inspect(compaction.err))
      t.eq(compaction.session, 'agent-1')
      t.eq(compaction.result.compacted, true, vim.inspect(compaction.result))
      t.eq(compaction.result.tokensBefore, second.tokens)
      t.wait_for('the compacted usage in the statusline', function()
        return sidecar.usage().tokens == compaction.result.tokensAfter
      end)
      -- The agent sees the compaction in the memory they share.
      t.eq(agent.request('context/usage', { sessionId = 'agent-1' }).tokens, compaction.result.tokensAfter)
    end, function()
      agent.close()
    end)
  end)

  t.test(':ContextUsage shows the prompt cache hit rate when the server sends it', function()
    t.eq(status.cache_text({ cacheHitRate = 0.625, cacheHitRateSmoothed = 0.5809 }),
      'prompt cache hit rate 63% last call, 58% smoothed')
    t.eq(status.cache_text({ cacheHitRate = vim.NIL, cacheHitRateSmoothed = 0 }), 'prompt cache hit rate 0% smoothed')
    t.eq(status.cache_text({ cacheHitRate = vim.NIL, cacheHitRateSmoothed = vim.NIL }), nil)
    t.eq(status.cache_text({}), nil)

    ingest('cache', { big_message('c0', 100) })
    sidecar.set_session('cache')
    -- 800 of 1,000 input tokens read from the cache: a hit rate of 80%.
    client.call(require('context_sidecar').client(), 'notify', 'context/reportUsage', {
      sessionId = 'cache', inputTokens = 100, outputTokens = 20, cacheReadTokens = 800, cacheWriteTokens = 100,
    })
    local usage = request('context/usage', { sessionId = 'cache' })
    local before = #notifications
    vim.cmd('ContextUsage')
    t.wait_for('the usage message', function()
      return #notifications > before
    end)
    local shown = notifications[#notifications].message
    t.match(shown, 'session cache', shown)
    if type(usage.cacheHitRate) == 'number' then
      t.match(shown, ' · prompt cache hit rate 80%% last call', shown)
    else
      t.ok(not shown:find('prompt cache', 1, true), 'a server without the figures gets no cache part: ' .. shown)
    end
  end)

  t.test('follow_workspace = false shows only sessions this Neovim works on; setup() can turn it on', function()
    local workspace = vim.fn.tempname()
    vim.fn.mkdir(workspace, 'p')
    restart_in(workspace, { follow_workspace = false })
    t.eq(sidecar.workspace(), nil)
    local agent = start_agent(workspace)
    t.finally(function()
      agent.request('memory/ingest', { sessionId = 'agent-2', messages = { big_message('b1', 100) } })
      -- The host would send agent-2's usage to this connection before the reply to its own later ingest.
      local mine = ingest('mine', { big_message('n1', 200) }).usage
      t.wait_for('usage of its own session', function()
        local usage = sidecar.usage()
        return usage and usage.sessionId == 'mine' and usage.tokens == mine.tokens
      end)
      t.eq(status.usages['agent-2'], nil, 'usage of the agent\'s session arrived')
      -- Turned on while running: the agent's next ingest arrives.
      sidecar.setup({ cmd = cmd, settings = SETTINGS, root_dir = workspace, follow_workspace = true })
      t.eq(sidecar.workspace(), workspace)
      request('memory/sessions', vim.empty_dict()) -- the follow request, sent before it, is handled
      local agents = agent.request('memory/ingest', { sessionId = 'agent-2', messages = { big_message('b2', 100) } }).usage
      t.wait_for('usage of the agent\'s session', function()
        local usage = status.usages['agent-2']
        return usage ~= nil and usage.tokens == agents.tokens
      end)
      t.eq(status.selected, 'agent-2')
    end, function()
      agent.close()
    end)
  end)

  t.test(':ContextSession on an agent\'s session of another workspace follows it live', function()
    if not agent_workspace then
      t.skip('the agent test did not run')
    end
    local workspace = vim.fn.tempname()
    vim.fn.mkdir(workspace, 'p')
    restart_in(workspace)
    vim.cmd('ContextSession agent-1')
    t.wait_for('the pinned session\'s usage', function()
      return status.selected == 'agent-1' and sidecar.usage() ~= nil
    end)
    local agent = start_agent(agent_workspace)
    t.finally(function()
      local after = agent.request('memory/ingest', { sessionId = 'agent-1', messages = { big_message('a-last', 200) } }).usage
      t.wait_for('the agent\'s ingest in the statusline', function()
        return sidecar.usage().tokens == after.tokens
      end)
      t.eq(sidecar.statusline(), status.format(after))
    end, function()
      agent.close()
    end)
  end)

  t.test('an agent\'s transcript is followed with no MCP server: a line appended is found and moves the statusline',
    function()
      local workspace = vim.fn.tempname()
      vim.fn.mkdir(workspace, 'p')
      local agents = vim.fn.tempname()
      local saved = {}
      for _, name in ipairs({ 'CLAUDE_CONFIG_DIR', 'CODEX_HOME', 'PI_CODING_AGENT_DIR' }) do
        saved[name] = vim.env[name]
        vim.env[name] = agents .. '/' .. name:lower() -- where this Neovim's agents keep their transcripts
      end
      local project = vim.env.CLAUDE_CONFIG_DIR .. '/projects/' .. (workspace:gsub('[^%w]', '-'))
      vim.fn.mkdir(project, 'p')
      local path = project .. '/cc-nvim.jsonl'
      local parent, count = vim.NIL, 0
      -- Appends one entry as Claude Code 2.1 writes it (a queued prompt first for a user entry).
      local function write(kind, message)
        count = count + 1
        local uuid = string.format('00000000-0000-4000-8000-%012d', count)
        local entry = { parentUuid = parent, isSidechain = false, userType = 'external', cwd = workspace,
          sessionId = 'cc-nvim', version = '2.1.197', gitBranch = 'main', type = kind, message = message,
          uuid = uuid, timestamp = '2026-11-20T09:00:00.000Z' }
        parent = uuid
        local file = assert(io.open(path, 'a'))
        if kind == 'user' then
          file:write(vim.fn.json_encode({ type = 'queue-operation', operation = 'enqueue', sessionId = 'cc-nvim',
            timestamp = '2026-11-20T09:00:00.000Z', content = message.content }) .. '\n')
        end
        file:write(vim.fn.json_encode(entry) .. '\n')
        file:close()
      end
      local function answer(text, cache_read)
        write('assistant', { id = 'msg_' .. count, type = 'message', role = 'assistant',
          model = 'claude-sonnet-4-5-20250929', content = { { type = 'text', text = text } }, stop_reason = 'end_turn',
          usage = { input_tokens = 4, cache_creation_input_tokens = 600, cache_read_input_tokens = cache_read,
            output_tokens = 40 } })
        return 4 + 600 + cache_read + 40
      end
      t.finally(function()
        write('user', { role = 'user', content = 'Where does the parser drop the last token?' })
        local counted = answer('In tokenize(): the loop stops one short.', 20000)
        restart_in(workspace)
        t.eq(sidecar.watched(), workspace)
        t.wait_for('the agent\'s session, counted by its provider', function()
          local usage = sidecar.usage()
          return usage and usage.sessionId == 'cc-nvim' and usage.source == 'provider' and usage.tokens == counted
        end, 30000)
        t.eq(sidecar.statusline(), status.format(sidecar.usage()))
        t.eq(sidecar.watching.transcripts[1].path, path)

        write('user', { role = 'user', content = 'And the PELICAN test, why does it fail?' })
        t.wait_for('the appended line', function()
          return sidecar.usage().messages == 3
        end, 30000)
        local found = request('memory/callTool', { sessionId = 'cc-nvim', name = 'memory_grep',
          arguments = vim.fn.json_encode({ pattern = 'PELICAN' }) })
        t.match(found.message.content, 'And the PELICAN test, why does it fail%?')

        local later = answer('It reads a fixture that moved.', 26000)
        t.wait_for('the agent\'s next count in the statusline', function()
          return sidecar.usage().tokens == later
        end, 30000)
        t.eq(sidecar.statusline(), status.format(sidecar.usage()))
      end, function()
        for name, value in pairs(saved) do
          vim.env[name] = value
        end
      end)
    end)

  t.test('a crashed server is restarted, up to the limit', function()
    require('context_sidecar.config').options.restart = { limit = 1, window_ms = 60000 }
    local first = sidecar.client()
    t.ok(first, 'not running')
    uv.kill(server_pid(first), 'sigkill')
    t.wait_for('the restart', function()
      local now = sidecar.client()
      return now ~= nil and now.id ~= first.id and status.running
    end)
    t.wait_for('usage after the restart', function()
      return sidecar.usage() ~= nil
    end)
    local second = sidecar.client()
    uv.kill(server_pid(second), 'sigkill')
    local function gave_up()
      return vim.tbl_filter(function(n)
        return n.message:find('not restarting', 1, true) ~= nil
      end, notifications)
    end
    -- The crash handler either gives up with this message or restarts; it has decided once it is there.
    t.wait_for('the message that it gives up', function()
      return #gave_up() > 0
    end)
    t.eq(#gave_up(), 1, vim.inspect(notifications))
    t.eq(sidecar.client(), nil)
    t.eq(status.running, false)
  end)

  t.core(':ContextRestart starts it again and :ContextStop shuts it down cleanly', function()
    vim.cmd('ContextRestart')
    t.wait_for('the restarted server', function()
      return status.running and sidecar.client() ~= nil
    end)
    vim.cmd('ContextStop')
    t.wait_for('the exit', function()
      return client.last_exit ~= nil and sidecar.client() == nil
    end)
    t.eq(client.last_exit.code, 0, 'exit code after shutdown and exit')
    t.eq(sidecar.statusline(), status.format(sidecar.usage()))
  end)
end

local ok, err = xpcall(main, debug.traceback)
if not ok then
  t.failed = t.failed + 1
  t.out('not ok - the test runner failed')
  t.out('  # ' .. tostring(err):gsub('\n', '\n  # '))
end
sidecar.stop()
vim.fn.delete(db_dir, 'rf')

t.core('no deprecated Neovim API was called or reported', function()
  t.eq(deprecations, {})
  local reported = vim.tbl_filter(function(n)
    return n.message:lower():find('deprecat') ~= nil
  end, notifications)
  t.eq(reported, {})
  local messages = vim.fn.execute('messages')
  t.ok(not messages:lower():find('deprecat'), messages)
end)
t.finish()

---A minimal test harness for headless Neovim: `test(name, fn)`, then `finish()` exits with the result.
local M = { passed = 0, failed = 0, skipped = 0 }

local function out(line)
  io.stdout:write(line .. '\n')
  io.stdout:flush()
end

M.out = out

---@class Skip
local Skip = {}

---Skip the running test.
---@param reason string
function M.skip(reason)
  error(setmetatable({ reason = reason }, Skip), 0)
end

---When set, only the tests declared with `core()` run; the others are reported skipped with this reason.
---@type string|nil
M.only_core = nil

---@param name string
---@param fn fun()
---@param core boolean|nil
function M.test(name, fn, core)
  if M.only_core and not core then
    M.skipped = M.skipped + 1
    out('ok - ' .. name .. ' # SKIP ' .. M.only_core)
    return
  end
  local ok, err = xpcall(fn, function(e)
    if getmetatable(e) == Skip then
      return e
    end
    return debug.traceback(tostring(e), 2)
  end)
  if ok then
    M.passed = M.passed + 1
    out('ok - ' .. name)
  elseif getmetatable(err) == Skip then
    M.skipped = M.skipped + 1
    out('ok - ' .. name .. ' # SKIP ' .. err.reason)
  else
    M.failed = M.failed + 1
    out('not ok - ' .. name)
    for _, line in ipairs(vim.split(err, '\n', { plain = true })) do
      out('  # ' .. line)
    end
  end
end

---A test of the core path (start, ingest, statusline, sessions, compaction, stop), which also runs on a team
---database.
---@param name string
---@param fn fun()
function M.core(name, fn)
  M.test(name, fn, true)
end

---@param cond any
---@param message string|nil
function M.ok(cond, message)
  if not cond then
    error(message or 'assertion failed', 2)
  end
end

function M.eq(actual, expected, message)
  if not vim.deep_equal(actual, expected) then
    error(string.format('%sexpected %s, got %s', message and (message .. ': ') or '', vim.inspect(expected),
      vim.inspect(actual)), 2)
  end
end

function M.match(text, pattern, message)
  if type(text) ~= 'string' or not text:find(pattern) then
    error(string.format('%s%s does not match %s', message and (message .. ': ') or '', vim.inspect(text), pattern), 2)
  end
end

---Wait up to `timeout_ms` for `cond()`; fails the test with `what` otherwise.
--- Runs body, then cleanup even when body fails; a failure of body is raised again afterwards.
function M.finally(body, cleanup)
  local ok, err = pcall(body)
  cleanup()
  if not ok then
    error(err, 0)
  end
end

function M.wait_for(what, cond, timeout_ms)
  local ok = vim.wait(timeout_ms or 10000, cond, 20)
  if not ok then
    error('timed out waiting for ' .. what, 2)
  end
end

---Print the closing line and leave Neovim with a non-zero code on any failure.
function M.finish()
  out(string.format('%d passed, %d failed, %d skipped', M.passed, M.failed, M.skipped))
  if M.failed > 0 then
    vim.cmd('cquit 1')
  else
    vim.cmd('qall!')
  end
end

return M

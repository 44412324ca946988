---`context/follow`: sessions whose usage reaches this connection although other clients (an agent on
---the same database) change them. The server pushes a followed session's usage at once.
local client = require('context_sidecar.client')
local protocol = require('context_sidecar.protocol')
local util = require('context_sidecar.util')

local methods = protocol.methods
local M = {}

---The workspace and the pinned session this connection follows by request.
---@type string|nil
local workspace_followed = nil
---@type string|nil
local session_followed = nil
---The workspace whose agent transcripts the server follows for this connection (`memory/watch`).
---@type string|nil
local workspace_watched = nil

---The environment variables that say where agents keep their transcripts.
M.AGENT_ENV_NAMES = { 'HOME', 'CLAUDE_CONFIG_DIR', 'CODEX_HOME', 'PI_CODING_AGENT_DIR', 'PI_CODING_AGENT_SESSION_DIR' }

---A new connection follows and watches nothing yet.
function M.reset()
  workspace_followed, session_followed, workspace_watched = nil, nil, nil
end

---This Neovim's agent variables, as `memory/watch` takes them.
---@return table<string, string>
function M.agent_env()
  local env = {}
  for _, name in ipairs(M.AGENT_ENV_NAMES) do
    local value = vim.env[name]
    if type(value) == 'string' and value ~= '' then
      env[name] = value
    end
  end
  return env
end

---Have the server follow the agent transcripts of `want` (nil: of none), as long as this connection lives.
---@param c table|nil the LSP client
---@param want string|nil
---@param on_result fun(result: table)|nil called with the `memory/watch` result
function M.watch(c, want, on_result)
  if not c or want == workspace_watched then
    return
  end
  local before = workspace_watched
  workspace_watched = want
  if before then
    client.call(c, 'request', methods.MEMORY_WATCH, { workspace = before, watch = false }, function() end)
  end
  if want then
    local params = { workspace = want, watch = true, env = require('context_sidecar.config').json_object(M.agent_env()) }
    client.call(c, 'request', methods.MEMORY_WATCH, params, function(err, result)
      if err then
        workspace_watched = nil
        util.notify(string.format('cannot follow the agent transcripts of %s: %s', want, util.describe_error(err)),
          vim.log.levels.WARN)
      elseif on_result then
        on_result(result)
      end
    end)
  end
end

---@param c table the LSP client
---@param params table
---@param on_error fun(err: table)|nil
local function send(c, params, on_error)
  client.call(c, 'request', methods.CONTEXT_FOLLOW, params, function(err)
    if err and on_error then
      on_error(err)
    end
  end)
end

---Follow every session of `want` (nil: none), unfollowing the workspace followed before.
---@param c table|nil the LSP client
---@param want string|nil
---@return boolean changed
function M.workspace(c, want)
  if not c or want == workspace_followed then
    return false
  end
  local function complain(workspace, verb)
    return function(err)
      util.notify(string.format('cannot %s the sessions of %s: %s', verb, workspace, util.describe_error(err)),
        vim.log.levels.WARN)
    end
  end
  if workspace_followed then
    send(c, { workspace = workspace_followed, follow = false }, complain(workspace_followed, 'unfollow'))
  end
  if want then
    send(c, { workspace = want, follow = true }, complain(want, 'follow'))
  end
  workspace_followed = want
  return true
end

---Follow the pinned session (nil: none), also when it belongs to another workspace.
---@param c table|nil the LSP client
---@param session_id string|nil
function M.session(c, session_id)
  if not c or session_id == session_followed then
    return
  end
  if session_followed then
    send(c, { sessionId = session_followed, follow = false }, nil)
  end
  session_followed = session_id
  if session_id then
    send(c, { sessionId = session_id, follow = true }, function(err)
      -- -32001: no such session yet; this connection follows it anyway once it ingests into it.
      if err.code == protocol.errors.UNKNOWN_SESSION then
        session_followed = nil
      else
        util.notify('cannot follow session ' .. session_id .. ': ' .. util.describe_error(err), vim.log.levels.WARN)
      end
    end)
  end
end

return M

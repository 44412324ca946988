---Messages to the user.
local M = {}

---`vim.notify` with the plugin's prefix, safe to call from RPC callbacks.
---@param message string
---@param level integer|nil a vim.log.levels value
function M.notify(message, level)
  vim.schedule(function()
    vim.notify('context-sidecar: ' .. message, level or vim.log.levels.INFO)
  end)
end

---@param err table a JSON-RPC error
---@return string
function M.describe_error(err)
  return string.format('%s (%s)', err.message or vim.inspect(err), tostring(err.code))
end

return M

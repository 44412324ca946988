---A TCP listener on 127.0.0.1 that takes HTTP requests and never answers: a summarizer that hangs.
local M = {}
local uv = vim.uv or vim.loop

---@return {port: integer, received: fun(): boolean, close: fun()}
function M.start()
  local server = uv.new_tcp()
  server:bind('127.0.0.1', 0)
  local clients = {}
  local got_request = false
  server:listen(16, function(err)
    assert(not err, err)
    local conn = uv.new_tcp()
    server:accept(conn)
    table.insert(clients, conn)
    conn:read_start(function(_, data)
      if data and data:find('\r\n\r\n', 1, true) then
        got_request = true
      end
    end)
  end)
  return {
    port = server:getsockname().port,
    received = function()
      return got_request
    end,
    close = function()
      for _, conn in ipairs(clients) do
        if not conn:is_closing() then
          conn:close()
        end
      end
      server:close()
    end,
  }
end

return M

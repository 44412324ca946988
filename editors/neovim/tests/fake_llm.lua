---An HTTP listener on 127.0.0.1 standing in for an OpenAI-compatible endpoint: it never answers
---(a summarizer that hangs), or answers every request with one HTTP error status.
local M = {}
local uv = vim.uv or vim.loop

---@param opts {status: integer|nil}|nil `status`: answer with this HTTP status; nil: never answer
---@return {port: integer, received: fun(): boolean, close: fun()}
function M.start(opts)
  local status = opts and opts.status
  local server = uv.new_tcp()
  server:bind('127.0.0.1', 0)
  local clients = {}
  local got_request = false
  server:listen(16, function(err)
    assert(not err, err)
    local conn = uv.new_tcp()
    server:accept(conn)
    table.insert(clients, conn)
    local buffered = ''
    conn:read_start(function(_, data)
      buffered = buffered .. (data or '')
      local head_end = buffered:find('\r\n\r\n', 1, true)
      if not head_end then
        return
      end
      got_request = true
      local length = tonumber(buffered:sub(1, head_end):lower():match('content%-length:%s*(%d+)')) or 0
      if status and #buffered >= head_end + 3 + length then
        buffered = buffered:sub(head_end + 4 + length)
        local body = string.format('{"error": {"message": "fake endpoint says %d", "type": "invalid_request_error"}}',
          status)
        conn:write(string.format('HTTP/1.1 %d Error\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s',
          status, #body, body))
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

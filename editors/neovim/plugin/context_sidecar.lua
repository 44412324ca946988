-- User commands of context-sidecar; the server starts on require('context_sidecar').setup().
if vim.g.loaded_context_sidecar then
  return
end
vim.g.loaded_context_sidecar = true

local function sidecar()
  return require('context_sidecar')
end

local command = vim.api.nvim_create_user_command

command('ContextCompact', function(args)
  sidecar().compact({ focus = args.args })
end, { nargs = '?', desc = 'Compact the session context; the argument is an optional focus for the summary' })

command('ContextCompactCancel', function()
  sidecar().cancel()
end, { nargs = 0, desc = 'Cancel the running compaction' })

command('ContextUsage', function()
  sidecar().show_usage()
end, { nargs = 0, desc = 'Show the context usage of the session' })

command('ContextSessions', function()
  sidecar().show_sessions()
end, { nargs = 0, desc = 'List the stored sessions in a read-only buffer' })

command('ContextExpand', function(args)
  sidecar().expand(args.args)
end, { nargs = 1, desc = 'Show what a summary (or pruned message) stands for, in a read-only buffer' })

command('ContextSession', function(args)
  if args.args ~= '' then
    sidecar().set_session(args.args)
    return
  end
  local ids = sidecar().known_sessions()
  table.insert(ids, 1, '(follow the most recently updated session)')
  vim.ui.select(ids, { prompt = 'Context session' }, function(choice, index)
    if choice then
      sidecar().set_session(index > 1 and choice or nil)
    end
  end)
end, {
  nargs = '?',
  complete = function()
    return sidecar().known_sessions()
  end,
  desc = 'Show this session (no argument: choose, or follow the latest)',
})

command('ContextRestart', function()
  sidecar().restart()
end, { nargs = 0, desc = 'Restart the context-sidecar server' })

command('ContextStop', function()
  sidecar().stop()
end, { nargs = 0, desc = 'Stop the context-sidecar server' })

vim.api.nvim_create_autocmd('VimLeavePre', {
  group = vim.api.nvim_create_augroup('context_sidecar', { clear = true }),
  callback = function()
    if package.loaded['context_sidecar'] then
      require('context_sidecar').stop()
    end
  end,
})

-- Puts reservations written before the listing index existed into it (run by the retention
-- crawl a bounded batch at a time; ZADD makes a repeat harmless).
-- KEYS[1] listing index  KEYS[2..] reservation records
-- ARGV[1..] their created-index members (aligned with KEYS[2..])
local added = 0
for i = 2, #KEYS do
  local rec = load_record(KEYS[i])
  if rec and STATUS_MARK[rec.status] and rec.estimate and rec.expires and rec.subject then
    local ok, subject = pcall(cjson.decode, rec.subject)
    local scope = rec.scope or (ok and type(subject) == 'table' and scope_path_of(subject))
    if scope then
      list_add(KEYS[1], list_members(string.sub(ARGV[i - 1], 14), rec.status, rec.subject, rec.estimate, scope,
        rec.expires))
      added = added + 1
    end
  end
end
return {'OK', cjson.encode({tostring(added)}), '', '0'}

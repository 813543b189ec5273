-- Redis's clock, the replies every script gives, idempotency records and stored answers, and
-- hash records as scripts hand them back.
-- needs: nothing

-- Redis's clock in ms, as a number and as digits: the seconds' digits and the first three of
-- the microseconds' six (digits, read once as a number: cheaper than arithmetic on both and a
-- format).
local function now_ms()
  local t = redis.call('TIME')
  local now_s = t[1] .. string.sub('00000' .. t[2], -6, -4)
  return now_s + 0, now_s
end

-- A memo kept in the script VM across calls ({max, kept, known}; the library's top level
-- outlives a call under Functions): `value` stored under `key` and returned; at most `max`
-- entries, then it starts over. A memo of values decoded from stored texts also has `texts`
-- and is given the `text` each value was read from (`recall`): two maps, so remembering a new
-- text makes no table of its own.
local function remember(memo, key, value, text)
  if memo.kept >= memo.max then memo.known, memo.kept = {}, 0; if text then memo.texts = {} end end
  memo.known[key], memo.kept = value, memo.kept + 1
  if text then memo.texts[key] = text end
  return value
end

-- The value remembered for `key` with `remember(memo, key, value, text)` while the stored text
-- is still `text` (the same string), else nil: a memo never stale whatever else writes the text.
local function recall(memo, key, text)
  return text ~= nil and memo.texts[key] == text and memo.known[key] or nil
end

-- Every script's first step (its prologue calls `SLOT.moving` with its first key). Redis
-- Cluster checks the keys a call names before it runs the call (ASK or TRYAGAIN while their
-- slot moves), but a key a script reaches through `KEY` (a usage log, event counts, a
-- reservation's metadata) only when the script touches it: while the slot migrates away, a
-- touch of one that is not on this node (moved already, or not made yet) raises mid-script,
-- after the writes before it. So a script first reads a key never written (`KEY.slot_check`):
-- while its slot leaves this node that read is refused, and the script answers TRYAGAIN before
-- any write (not run: the gateway retries, and meets the slot moved). Whether the server is a
-- cluster node is asked once per script VM (a refusal other than "cluster support disabled"
-- counts as a cluster: checking costs a read, not checking a half-written call); an EVALSHA
-- script, whose memos last one call, reads without asking (its prologue says `clustered`).
local SLOT = {checks = {known = {}, kept = 0, max = 1000}}
function SLOT.moving(first_key)
  if SLOT.clustered == nil then
    local id = redis.pcall('CLUSTER', 'MYID')
    SLOT.clustered = not (type(id) == 'table' and string.find(tostring(id.err), 'cluster support disabled', 1, true))
  end
  if not SLOT.clustered or not first_key then return nil end
  local key = SLOT.checks.known[first_key]
  if key == nil then key = remember(SLOT.checks, first_key, KEY.slot_check(first_key) or false) end
  local read = key and redis.pcall('EXISTS', key)
  if type(read) == 'table' and read.err then return redis.error_reply('TRYAGAIN the slot of this call is moving') end
  return nil
end

-- The replies every script gives: `ok` (the result, a table or JSON text, with the record's
-- status where it has one), `replayed` (the stored answer of an earlier identical request), or
-- `err` (an error code the Rust side knows, a message, optional JSON `details`, and an HTTP
-- status where it differs from the code's usual one). `now_s` is Redis's clock as digits.
-- `ok` and `replayed` answer one string, the tag, status, clock and result joined by \31 (the
-- result last, whatever it holds): Redis turns a script's table into its reply field by field,
-- 1-1.7% of a request for four. A long result (a listing's page) goes as the table
-- {tag, result, status, now_s} instead: joining copies and hashes every byte of it again; so
-- does an answer with an `attachment` (text handed over as stored), last in the table.
local function answer(tag, result, status, now_s, attachment)
  if type(result) ~= 'string' then result = cjson.encode(result) end
  if attachment or #result > 1024 then return {tag, result, status or '', now_s or '0', attachment} end
  return tag .. '\31' .. (status or '') .. '\31' .. (now_s or '0') .. '\31' .. result
end
local function ok(result, status, now_s) return answer('OK', result, status, now_s) end
local function replayed(result, status, now_s) return answer('REPLAY', result, status, now_s) end

local function err(code, message, details, status)
  return {'ERR', code, message, details or '', status and tostring(status) or ''}
end

-- A stored answer in the shape of today's answers: stored results are JSON objects; those
-- written before were arrays, which `legacy` turns into the object (nil: none are expected).
local function stored_answer(json, legacy)
  if legacy and string.sub(json, 1, 1) == '[' then return legacy(cjson.decode(json)) end
  return json
end

-- The answer stored under an idempotency record (a hash with `payload_hash` and `result`): its
-- replay for the same payload hash, 409 for another payload, nil when the key is new.
local function replay(record_key, payload_hash, status, now_s, legacy)
  local prior = redis.call('HMGET', record_key, 'payload_hash', 'result')
  if not prior[1] then return nil end
  if prior[1] ~= payload_hash then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH) end
  return replayed(stored_answer(prior[2], legacy), status, now_s)
end

-- ---------------------------------------------------------------------------------------------
-- Operator plane helpers

-- A hash record as one JSON object of strings (scripts hand records back this way).
local function record_json(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return '{}' end
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return cjson.encode(t)
end

-- HSET of a table of string fields; '' values delete the field (an optional cleared).
local function write_fields(key, fields)
  local set, del = {}, {}
  for f, v in pairs(fields) do
    if v == '' then del[#del + 1] = f else set[#set + 1] = f; set[#set + 1] = v end
  end
  if #set > 0 then redis.call('HSET', key, unpack(set)) end
  if #del > 0 then redis.call('HDEL', key, unpack(del)) end
end

-- A JSON array of strings from a ",a,b," list (cjson would encode an empty table as {}).
local function csv_json(csv)
  local out = {}
  for v in string.gmatch(csv or '', '[^,]+') do out[#out + 1] = cjson.encode(v) end
  return '[' .. table.concat(out, ',') .. ']'
end

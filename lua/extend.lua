-- Extend: push an ACTIVE reservation's expiry out by extend_by_ms (from its current expiry, and
-- only before it: extend has no grace period). The answer is kept under the extend's own
-- idempotency record for as long as the reservation's keys live.
local now, now_s = now_ms()
local r, answer = open_reservation(K, A, now, function(r)
  return replay(K.extend_record, A.payload_hash, r.status, now_s, function(old)
    return {expires_at_ms = old[1]}
  end)
end)
if not r then return answer end
if now > r.expires_at then return err('RESERVATION_EXPIRED', MSG.RESERVATION_EXPIRED_NO_GRACE) end
if r.extensions >= r.max_extensions then
  return err('MAX_EXTENSIONS_EXCEEDED', 'Reservation was already extended ' .. r.extensions .. ' times (limit ' ..
    r.max_extensions .. ')')
end

local expires_at = r.expires_at + tonumber(A.extend_by_ms)
local expires = itoa(expires_at)
local token = token_of(r.rid)
list_move(K.listing_index, 'x' .. padded(r.rec.expires, 13) .. token, 'x' .. padded(expires, 13) .. token)
save_extension(K.reservation, r.rec, expires, itoa(r.extensions + 1))
-- (numbers go to Redis as digits: a Lua number is formatted as a float)
redis.call('ZADD', K.expiry_index, itoa(expires_at + r.grace_ms), r.rid)
local result = cjson.encode({expires_at_ms = expires})
redis.call('HSET', K.extend_record, 'payload_hash', A.payload_hash, 'result', result)
redis.call('PEXPIRE', K.extend_record, itoa(expires_at + r.grace_ms - now + tonumber(A.record_ttl_ms)))
return ok(result, 'ACTIVE', now_s)

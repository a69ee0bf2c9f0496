-- A fleet's routing state shared by every gateway in front of it: per endpoint, until when
-- it is out after failures and until when it is rate-limited (its Retry-After), as Unix
-- milliseconds, 0 for not. KEYS[1] is the fleet's hash (field: the endpoint's label,
-- value: "ejected,limited"). ARGV holds each endpoint this gateway knows, three by three:
-- label, its ejected-until and limited-until as this gateway sees them. The later of each
-- pair wins, is kept, and is returned in the same order, so one call both tells what
-- this gateway saw and learns what the others did.
local out = {}
for i = 1, #ARGV, 3 do
  local label = ARGV[i]
  local ejected = tonumber(ARGV[i + 1])
  local limited = tonumber(ARGV[i + 2])
  local kept = redis.call('HGET', KEYS[1], label)
  if kept then
    local e, l = string.match(kept, '^(%d+),(%d+)$')
    if e then
      ejected = math.max(ejected, tonumber(e))
      limited = math.max(limited, tonumber(l))
    end
  end
  redis.call('HSET', KEYS[1], label, string.format('%d,%d', ejected, limited))
  out[#out + 1] = {ejected, limited}
end
-- A fleet no gateway serves any more is forgotten after a day.
redis.call('PEXPIRE', KEYS[1], 86400000)
return out

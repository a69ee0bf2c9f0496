-- Per-key rate limits and token quotas shared by every gateway, checked and charged in one
-- call. ARGV[1] is the number n of limits and ARGV[2] the number q of quotas.
--
-- KEYS[i] (i <= n) is the bucket of limit i (requests first, then tokens); ARGV[1 + 2i]
-- is its size per minute and ARGV[2 + 2i] what this request costs. A bucket holds its
-- theoretical arrival time (TAT): microseconds on Redis's clock, so gateways whose
-- clocks differ still agree. A request passes a limit when the TAT it would leave is at
-- most a minute ahead. The limits are tried in order and the first refusal stops the
-- charging: a refused token charge still counts the request, as in one gateway.
--
-- With quotas, KEYS[n + j] is the counter of quota j (tokens used in the day or the
-- month) and ARGV[2 + 2n + j] its size; KEYS[n + q + 1] holds the key's requests in
-- flight, a sorted set of "<hold id>:<tokens>" scored by when each hold lapses, should
-- its gateway stop before it ends it. ARGV[3 + 2n + q] is this request's hold id,
-- ARGV[4 + 2n + q] its tokens and ARGV[5 + 2n + q] how many milliseconds the hold may
-- last. A quota whose used and held tokens reach its size refuses the request before any
-- limit is charged: the script returns {{-2, j, used, held}} alone. A request that passes
-- every limit holds its tokens.
--
-- Otherwise it returns, per limit, {outcome, remaining, retry_us}: outcome 1 charged, 0
-- refused (retry_us: when it would pass), -1 never fits (the cost is over the limit), 2
-- not tried; remaining is what is left after the charge, or as it stands when none was
-- made; then, per quota, {3, used, 0}.
local n = tonumber(ARGV[1])
local q = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local holds = KEYS[n + q + 1]
if q > 0 then
  redis.call('ZREMRANGEBYSCORE', holds, '-inf', string.format('%.17g', now))
  local held = 0
  for _, hold in ipairs(redis.call('ZRANGE', holds, 0, -1)) do
    held = held + (tonumber(string.match(hold, ':(%d+)$')) or 0)
  end
  -- A quota used up is said before one only held (the first is not worth a retry).
  local used = {}
  for j = 1, q do
    used[j] = tonumber(redis.call('GET', KEYS[n + j])) or 0
    if used[j] >= tonumber(ARGV[2 + 2 * n + j]) then
      return {{-2, j, used[j], held}}
    end
  end
  for j = 1, q do
    if used[j] + held >= tonumber(ARGV[2 + 2 * n + j]) then
      return {{-2, j, used[j], held}}
    end
  end
end
local minute = 60000000
-- The TAT is a sum of fractions of a microsecond; a microsecond of slack keeps its
-- rounding from refusing the last cell of a full minute.
local slack = 1
local out = {}
local refused = false
for i = 1, n do
  local key = KEYS[i]
  local limit = tonumber(ARGV[1 + 2 * i])
  local cost = tonumber(ARGV[2 + 2 * i])
  local interval = minute / limit
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then
    tat = now
  end
  local function left(used)
    local cells = math.floor((minute - used) / interval + 1e-6)
    if cells < 0 then
      return 0
    end
    return cells
  end
  if refused then
    out[i] = {2, left(tat - now), 0}
  elseif cost > limit then
    refused = true
    out[i] = {-1, left(tat - now), 0}
  else
    local next_tat = tat + cost * interval
    local used = next_tat - now
    if used > minute + slack then
      refused = true
      out[i] = {0, left(tat - now), math.ceil(used - minute)}
    else
      -- %.17g keeps every bit of the number; the key outlives the bucket by a second.
      redis.call('SET', key, string.format('%.17g', next_tat),
        'PX', math.ceil(used / 1000) + 1000)
      out[i] = {1, left(used), 0}
    end
  end
end
if q > 0 and not refused then
  local hold = 2 + 2 * n + q
  local lasts = tonumber(ARGV[hold + 3])
  redis.call('ZADD', holds, string.format('%.17g', now + lasts * 1000),
    ARGV[hold + 1] .. ':' .. ARGV[hold + 2])
  -- The set lives as long as its last hold may.
  if redis.call('PTTL', holds) < lasts then
    redis.call('PEXPIRE', holds, lasts)
  end
end
for j = 1, q do
  out[n + j] = {3, tonumber(redis.call('GET', KEYS[n + j])) or 0, 0}
end
return out

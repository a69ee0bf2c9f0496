-- Per-key rate limits and token quotas shared by every gateway, checked and charged in one
-- call. ARGV[1] is the number n of limits. KEYS[i] (i <= n) is the bucket of limit i
-- (requests first, then tokens); ARGV[2i] is its size per minute and ARGV[2i+1] what
-- this request costs. KEYS[n+j] is the counter of quota j (tokens used in the day or
-- the month), ARGV[2n+1+j] its size: a quota used up refuses the request before any
-- limit is charged, and the script returns {{-2, used, j}} alone. A bucket holds its
-- theoretical arrival time (TAT): microseconds on Redis's clock, so gateways whose
-- clocks differ still agree. A request passes a limit when the TAT it would leave is at
-- most a minute ahead. The limits are tried in order and the first refusal stops the
-- charging: a refused token charge still counts the request, as in one gateway.
--
-- Otherwise it returns, per limit, {outcome, remaining, retry_us}: outcome 1 charged, 0
-- refused (retry_us: when it would pass), -1 never fits (the cost is over the limit), 2
-- not tried; remaining is what is left after the charge, or as it stands when none was
-- made; then, per quota, {3, used, 0}.
local n = tonumber(ARGV[1])
for j = 1, #KEYS - n do
  local used = tonumber(redis.call('GET', KEYS[n + j])) or 0
  if used >= tonumber(ARGV[2 * n + 1 + j]) then
    return {{-2, used, j}}
  end
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local minute = 60000000
-- The TAT is a sum of fractions of a microsecond; a microsecond of slack keeps its
-- rounding from refusing the last cell of a full minute.
local slack = 1
local out = {}
local refused = false
for i = 1, n do
  local key = KEYS[i]
  local limit = tonumber(ARGV[2 * i])
  local cost = tonumber(ARGV[2 * i + 1])
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
for j = 1, #KEYS - n do
  out[n + j] = {3, tonumber(redis.call('GET', KEYS[n + j])) or 0, 0}
end
return out

-- An answer's end, for its key's quotas: its tokens added to each counter and its hold
-- released, in one step, so no gateway sees the tokens both counted and held, or
-- neither. KEYS[1] is the key's set of holds, ARGV[1] this request's hold
-- ("<hold id>:<tokens>"); KEYS[1 + j] is quota j's counter, ARGV[1 + 2j - 1] the tokens
-- to add (0: none) and ARGV[1 + 2j] how many seconds the counter is kept.
redis.call('ZREM', KEYS[1], ARGV[1])
for j = 1, #KEYS - 1 do
  local tokens = tonumber(ARGV[2 * j])
  if tokens > 0 then
    redis.call('INCRBY', KEYS[1 + j], tokens)
    redis.call('EXPIRE', KEYS[1 + j], ARGV[2 * j + 1])
  end
end
return 1

"""The claims' Lua scripts (``adapters.stores.claims`` says what each decides and why): the claim,
release, confirmation, mid-scoring reservation and done marks, each one atomic call per project
and batch. Each script's KEYS and ARGV are written above it."""

# Every script reads per hash: ``stored_fields(first, stride, key_offset)`` groups the pairs of
# ARGV (from ``first``, ``stride`` arguments each: hash index, field, ...) by hash and reads each
# hash with one HMGET (in chunks: Lua's stack is finite). Returns the fields per hash and what
# is stored, by "<hash index> <field>".
from adapters.stores.scripts import NOW_MS
from adapters.stores.verdicts import KEEP_VERDICTS

STORED_FIELDS = """
local function stored_fields(first, stride, key_offset)
  local by_hash = {}
  for i = first, #ARGV, stride do
    local h = tonumber(ARGV[i])
    by_hash[h] = by_hash[h] or {}
    table.insert(by_hash[h], ARGV[i + 1])
  end
  local stored = {}
  for h, fields in pairs(by_hash) do
    for from = 1, #fields, 4000 do
      local chunk = {}
      for k = from, math.min(from + 3999, #fields) do table.insert(chunk, fields[k]) end
      local values = redis.call('HMGET', KEYS[h + key_offset], unpack(chunk))
      for k, field in ipairs(chunk) do stored[h .. ' ' .. field] = values[k] end
    end
  end
  return by_hash, stored
end
"""

# Adds a reservation to a budget key (an integer: "%d", never "1e+15") and keeps the key for
# ``ttl`` seconds; nothing when there is nothing to add.
ADD = """
local function add(key, amount, ttl)
  if amount > 0 then
    redis.call('INCRBY', key, string.format('%d', amount))
    redis.call('EXPIRE', key, ttl)
  end
end
"""

# KEYS: the calls budget key, the tokens key, the money key (the project's window), the claim
# hashes, the groups' money keys (their day), then the verdict cache's buckets (newest first).
# ARGV: owner, lease ms, calls cap (-1: none), budget TTL, hash TTL, tokens cap (-1: none),
# "1" to fill (a backfill: see ``Claims``), the number of claim hashes, the number of verdict
# keys, the cost cap (-1: none), the number of group money keys, their TTL, the verdict keys,
# the groups' money limits; then per pair: hash index (1-based into the claim hashes), field,
# judge calls, token ceiling, the group's revision, its verdict keys ("<index into the verdict
# keys>:<token ceiling>,..."; index 0: a call under way in the worker), its money rates (nanos
# per token, per call: ``scoring.prices.Rates``) and its group's money key (1-based; 0: none).
# Money is counted in whole nanos, as integers (exact in Lua's doubles below 2**53). Returns a
# flat list: per pair state, detail, the verdict keys it reserved calls for ("<index>,..."), the
# calls, tokens and money it reserved; then per verdict key the verdict stored, or "".
CLAIM = STORED_FIELDS + ADD + NOW_MS + """
local owner, lease_ms, calls_cap, tokens_cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[6])
local lease = 'lease:' .. (now + lease_ms) .. ':' .. owner
local fill = ARGV[7] == '1'
local hashes, verdict_keys = tonumber(ARGV[8]), tonumber(ARGV[9])
local cost_cap, groups, group_ttl = tonumber(ARGV[10]), tonumber(ARGV[11]), ARGV[12]
local first_group_key, first_bucket = 4 + hashes, 4 + hashes + groups
local first_pair = 13 + verdict_keys + groups
local stride = 9
local n = (#ARGV - first_pair + 1) / stride

-- 1. what is stored for every pair: one HMGET per hash
local _, stored = stored_fields(first_pair, stride, 3)

-- 1b. the verdicts paid for already: one HMGET per bucket, the newest first
local cached = {}
for b = first_bucket, #KEYS do
  for from = 1, verdict_keys, 4000 do
    local last = math.min(from + 3999, verdict_keys)
    local values = redis.call('HMGET', KEYS[b], unpack(ARGV, 12 + from, 12 + last))
    for j, value in ipairs(values) do
      if value and not cached[from + j - 1] then cached[from + j - 1] = value end
    end
  end
end

-- 2. decide in order: a pair twice in the batch sees its own first decision
local used, tokens_used, cost_used = nil, nil, nil
local reserved, tokens_reserved, cost_reserved = 0, 0, 0
local group_used, group_reserved = {}, {}
local function over(want, tokens, cost, g)
  used = used or tonumber(redis.call('GET', KEYS[1]) or '0')
  tokens_used = tokens_used or tonumber(redis.call('GET', KEYS[2]) or '0')
  if (calls_cap >= 0 and used + reserved + want > calls_cap)
      or (tokens_cap >= 0 and tokens_used + tokens_reserved + tokens > tokens_cap) then return true end
  if cost_cap >= 0 then
    cost_used = cost_used or tonumber(redis.call('GET', KEYS[3]) or '0')
    if cost_used + cost_reserved + cost > cost_cap then return true end
  end
  if g > 0 then
    group_used[g] = group_used[g] or tonumber(redis.call('GET', KEYS[first_group_key + g - 1]) or '0')
    group_reserved[g] = group_reserved[g] or 0
    if group_used[g] + group_reserved[g] + cost > tonumber(ARGV[12 + verdict_keys + g]) then return true end
  end
  return false
end
local paid_in_batch = {}
local writes = {}
local out = {}
for i = 1, n do
  local at = first_pair + stride * (i - 1)
  local h, field, want, tokens = tonumber(ARGV[at]), ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local revision = '@' .. ARGV[at + 4]
  local per_token, per_call, g = tonumber(ARGV[at + 6]), tonumber(ARGV[at + 7]), tonumber(ARGV[at + 8])
  local leads = {}
  local cost = 0
  local slot = h .. ' ' .. field
  local current = stored[slot]
  local state, detail = nil, ''
  if current then
    if string.sub(current, 1, 5) == 'done:' then
      -- filling: done only under this revision (a changed rubric grades it again); a mark from
      -- before revisions were kept has none, and counts as done
      if not fill or string.sub(current, -string.len(revision)) == revision or not string.find(current, '@', 1, true)
      then state, detail = 'done', current end
    elseif string.sub(current, 1, 8) == 'skipped:' then
      if not fill then state, detail = 'skipped', current end  -- filling: a pair skipped has no rating yet
    else
      local expires = tonumber(string.match(current, '^lease:(%d+):'))
      if expires and expires > now then state, detail = 'busy', current end
    end
  end
  if not state then
    local value = lease
    state = 'claimed'
    -- the verdict cache: a call paid for already, or by an earlier pair of this batch, is not
    -- reserved again (a gates-first pair, reserving later, only reads what is paid for)
    for index, ceiling in string.gmatch(ARGV[at + 5], '(%d+):(%d+)') do
      index = tonumber(index)  -- 0: a call under way in the worker, nothing to read
      if index == 0 or cached[index] or paid_in_batch[index] then
        if want > 0 then
          want = want - 1
          tokens = math.max(0, tokens - tonumber(ceiling))
        end
      elseif want > 0 then
        table.insert(leads, index)
      end
    end
    if want > 0 or tokens > 0 then
      cost = tokens * per_token + want * per_call
      if over(want, tokens, cost, g) then
        -- filling: nothing is written, the job pauses and grades the pair in a later window
        value, state, detail = 'skipped:budget', 'exhausted', tostring(used + reserved)
        if fill then value = nil end
        leads, want, tokens, cost = {}, 0, 0, 0
      else
        reserved = reserved + want
        tokens_reserved = tokens_reserved + tokens
        if cost_cap >= 0 then cost_reserved = cost_reserved + cost end
        if g > 0 then group_reserved[g] = group_reserved[g] + cost end
        for _, index in ipairs(leads) do paid_in_batch[index] = true end
      end
    end
    if value then
      stored[slot] = value
      writes[h] = writes[h] or {}
      table.insert(writes[h], field)
      table.insert(writes[h], value)
    end
  end
  table.insert(out, state)
  table.insert(out, detail)
  table.insert(out, table.concat(leads, ','))
  table.insert(out, state == 'claimed' and tostring(want) or '0')
  table.insert(out, state == 'claimed' and tostring(tokens) or '0')
  table.insert(out, state == 'claimed' and cost or 0)  -- a number: an integer reply, never "1e+15"
end
for index = 1, verdict_keys do
  table.insert(out, cached[index] or '')
end

-- 3. write: one HSET (in chunks) and one EXPIRE per hash; each budget once
for h, flat in pairs(writes) do
  for from = 1, #flat, 4000 do
    redis.call('HSET', KEYS[h + 3], unpack(flat, from, math.min(from + 3999, #flat)))
  end
  redis.call('EXPIRE', KEYS[h + 3], ARGV[5])
end
add(KEYS[1], reserved, ARGV[4])
add(KEYS[2], tokens_reserved, ARGV[4])
add(KEYS[3], cost_reserved, ARGV[4])
for g, amount in pairs(group_reserved) do add(KEYS[first_group_key + g - 1], amount, group_ttl) end
return out
"""

# Both scripts below read and write per hash, as the claim does: one HMGET and one HSET or HDEL
# per hash touched, whatever the number of pairs. A lease is this owner's if its value ends with
# ":<owner>".
OWN_LEASES = STORED_FIELDS + """
local function own_leases(first, suffix)
  local by_hash, stored = stored_fields(first, 2, 0)
  local mine = {}
  for slot, current in pairs(stored) do
    if current and string.sub(current, 1, 6) == 'lease:'
        and string.sub(current, -string.len(suffix)) == suffix then
      mine[slot] = true
    end
  end
  return by_hash, mine
end
"""

# KEYS: claim hashes. ARGV: owner, then per pair: hash index, field. Deletes this owner's leases.
RELEASE = OWN_LEASES + """
local by_hash, mine = own_leases(2, ':' .. ARGV[1])
local released = 0
for h, fields in pairs(by_hash) do
  local gone = {}
  for _, field in ipairs(fields) do
    if mine[h .. ' ' .. field] then table.insert(gone, field) end
  end
  for from = 1, #gone, 4000 do
    released = released + redis.call('HDEL', KEYS[h], unpack(gone, from, math.min(from + 3999, #gone)))
  end
end
return released
"""


# KEYS: claim hashes. ARGV: owner, lease ms, then per pair: hash index, field. Per pair 1 when
# this owner still holds its lease (renewed from now, even if it had run out while no one took
# the pair), 0 when the pair is done or another worker's.
CONFIRM = OWN_LEASES + NOW_MS + """
local renewed = 'lease:' .. (now + tonumber(ARGV[2])) .. ':' .. ARGV[1]
local by_hash, mine = own_leases(3, ':' .. ARGV[1])
local writes = {}
local out = {}
for i = 3, #ARGV, 2 do
  local h, field = tonumber(ARGV[i]), ARGV[i + 1]
  if mine[h .. ' ' .. field] then
    writes[h] = writes[h] or {}
    table.insert(writes[h], field)
    table.insert(writes[h], renewed)
    table.insert(out, 1)
  else
    table.insert(out, 0)
  end
end
for h, flat in pairs(writes) do
  for from = 1, #flat, 4000 do
    redis.call('HSET', KEYS[h], unpack(flat, from, math.min(from + 3999, #flat)))
  end
end
return out
"""


# Judge calls decided while a pair is scored (``PairSpend``): a gates-first group's judges once its
# cheap gates passed, and each retry. KEYS: the calls budget key, the tokens key, the pair's claim
# hash, the money key, the group's money key (the money key again when it has none). ARGV: owner,
# calls cap (-1: none), budget TTL, calls, the pair's field, "1" to mark the pair skipped for
# budget when refused (still this owner's lease) as a claim that finds the budget exhausted does,
# tokens cap (-1: none), token ceiling of the calls, cost cap (-1: none), their money ceiling
# (nanos), the group's cost cap (-1: none), its key's TTL.
RESERVE = ADD + """
local calls_cap, calls = tonumber(ARGV[2]), tonumber(ARGV[4])
local tokens_cap, tokens = tonumber(ARGV[7]), tonumber(ARGV[8])
local cost_cap, cost, group_cost_cap = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local tokens_used = tonumber(redis.call('GET', KEYS[2]) or '0')
local refused = (calls_cap >= 0 and used + calls > calls_cap) or (tokens_cap >= 0 and tokens_used + tokens > tokens_cap)
  or (cost_cap >= 0 and tonumber(redis.call('GET', KEYS[4]) or '0') + cost > cost_cap)
  or (group_cost_cap >= 0 and tonumber(redis.call('GET', KEYS[5]) or '0') + cost > group_cost_cap)
if refused then
  if ARGV[6] == '1' then
    local current = redis.call('HGET', KEYS[3], ARGV[5])
    local suffix = ':' .. ARGV[1]
    if current and string.sub(current, 1, 6) == 'lease:' and string.sub(current, -string.len(suffix)) == suffix then
      redis.call('HSET', KEYS[3], ARGV[5], 'skipped:budget')
    end
  end
  return 0
end
add(KEYS[1], calls, ARGV[3])
add(KEYS[2], tokens, ARGV[3])
if cost_cap >= 0 then add(KEYS[4], cost, ARGV[3]) end
if group_cost_cap >= 0 then add(KEYS[5], cost, ARGV[12]) end
return 1
"""


# KEYS: a project's claim hashes, then its token and money windows, then its saved-by-cache
# windows, then - with verdicts to keep - the verdict cache's newest bucket, then - when its TTL
# is not 0 - the batch's once key. ARGV: the once TTL, the done marks' TTL, the number of hashes,
# then per hash the number of its fields and their field, value pairs; the number of windows,
# then per window the amount to settle and its TTL; the number of saved windows, then per saved
# window its calls, tokens and TTL; the number of verdicts, the bucket's most verdicts and when
# it expires (ms), then per verdict the index of its pair's hash, the pair's field, the
# verdict's key and entry. A batch's done marks, settlements, savings and verdicts of one project
# (one hash tag) in one command - and once: a batch recorded already adds nothing (-1).
#
# The first done mark wins: a pair another worker marked done keeps its mark, and the verdicts
# this batch paid for it are not kept - a cached verdict names the rating its pair's done mark
# names. Returns how many verdicts were kept.
MARK_DONE = STORED_FIELDS + KEEP_VERDICTS + """
local once_ttl = tonumber(ARGV[1])
if once_ttl > 0 and not redis.call('SET', KEYS[#KEYS], '1', 'NX', 'EX', once_ttl) then return -1 end
local at, hashes = 4, tonumber(ARGV[3])
local ours = {}
for h = 1, hashes do
  local n = tonumber(ARGV[at])
  local marks = {}
  for first = at + 1, at + 2 * n, 4000 do  -- unpack's limit (Lua's C stack, 8000): 2000 fields a call
    local fields = {}
    for i = first, math.min(first + 3999, at + 2 * n), 2 do table.insert(fields, ARGV[i]) end
    local stored = redis.call('HMGET', KEYS[h], unpack(fields))
    for k, field in ipairs(fields) do
      local current = stored[k]
      if not (current and string.sub(current, 1, 5) == 'done:') then
        ours[h .. ' ' .. field] = true
        table.insert(marks, field)
        table.insert(marks, ARGV[first + 2 * k - 1])
      end
    end
  end
  for from = 1, #marks, 4000 do
    redis.call('HSET', KEYS[h], unpack(marks, from, math.min(from + 3999, #marks)))
  end
  redis.call('EXPIRE', KEYS[h], ARGV[2])
  at = at + 1 + 2 * n
end
local windows = tonumber(ARGV[at])
at = at + 1
for w = hashes + 1, hashes + windows do
  redis.call('INCRBY', KEYS[w], ARGV[at])
  redis.call('EXPIRE', KEYS[w], ARGV[at + 1])
  at = at + 2
end
local saved = tonumber(ARGV[at])
at = at + 1
for k = hashes + windows + 1, hashes + windows + saved do
  redis.call('HINCRBY', KEYS[k], 'calls', ARGV[at])
  redis.call('HINCRBY', KEYS[k], 'tokens', ARGV[at + 1])
  redis.call('EXPIRE', KEYS[k], ARGV[at + 2])
  at = at + 3
end
local verdicts = tonumber(ARGV[at])
if verdicts == 0 then return 0 end
local most, expires_at = tonumber(ARGV[at + 1]), ARGV[at + 2]
local entries = {}
for v = at + 3, at + 2 + 4 * verdicts, 4 do
  if ours[ARGV[v] .. ' ' .. ARGV[v + 1]] then
    table.insert(entries, ARGV[v + 2])
    table.insert(entries, ARGV[v + 3])
  end
end
return keep_verdicts(KEYS[hashes + windows + saved + 1], most, expires_at, entries)
"""

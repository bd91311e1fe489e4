//! The Lua scripts the Redis store runs: each is loaded once and sent as `EVALSHA` (loaded again
//! when Redis answers `NOSCRIPT`, after a restart).

/// The apply script. `KEYS[1]` is the version counter; `KEYS[i+1]` the record key of change i.
/// `ARGV[1]` is how long a tombstone lives and how long a record of a table that [`super::lives`]
/// lives, in ms, as `<tombstone>:<record>`; `ARGV[2]` the layout to write (`s` one string per
/// record, `h` a hash of two fields: see the module documentation; `S`, `H` the same when a key
/// occurs twice in the apply, which the script then tracks) followed by the transaction number
/// the apply writes under (see [`super::RedisStore`]'s `reserved`). Then per change i:
/// `ARGV[3i]` its operation and what is expected, three bytes — `p` put, `x` put into a table
/// whose records expire like tombstones, `l` put with the records' lifetime, `d` delete, `e`
/// delete from such a table; `+` join the index always, `=` join it when the record is
/// created, `-` no index; `a` the key is expected absent (never seen), `r` a record at the
/// version that follows, `t` deleted at that version (that tombstone, or absent once it
/// expired), `w` a record at that version or absent (one its writer left to its lifetime) —
/// followed, for a table the gauges count ([`super::indexed`]), by the name of the table's index
/// set; `ARGV[3i+1]` the version expected (empty for `a`; in the string layout a record's, `r`
/// or `w`, is followed by `:`, so that the value's prefix is compared in place, without cutting
/// it out); `ARGV[3i+2]` the bytes (in the string layout the whole value, version and `:`
/// included; empty for a delete). Answers `{next, {i, …}}`: a
/// transaction number taken for the next apply, and the changes whose key was not as expected,
/// which are not written. A key twice in one apply is checked once; its second change is written
/// (or refused) as its first was.
///
/// In the string layout a put is one `SET … GET` (the puts of new keys that no index counts come
/// here only when the client's `SET … NX` found theirs taken): the old value comes back with
/// the write, and on the rare conflict the old value is put back.
/// Every `redis.call` is Redis's own CPU, which is what a busy cluster waits for (a profile of
/// `redis-server` showed more time in the calls' way in and out of Lua than in the commands), so
/// the common case is one call per record where the hash layout takes two or three (`HGET ver`,
/// `HSET v ver`, `PEXPIRE`). The script reads
/// both layouts whichever it writes: while instances switch protocol (within a second of each
/// other) a key may hold either. Bytes are compared with `string.byte`, not cut with
/// `string.sub` (each cut a new Lua string, hashed), and the version comes in as a string, put
/// in front of each value by the client (in Lua each would be a new string of the record's size,
/// and a Lua number passed to `redis.call` is formatted with `printf`).
pub(super) const APPLY: &str = r#"
local n = #KEYS - 1
local ttl, life = string.match(ARGV[1], '^(%d+):(%d+)$')
local mode = string.byte(ARGV[2], 1)
local strings = mode == 115 or mode == 83
local done = nil
if mode == 83 or mode == 72 then done = {} end
local v = string.sub(ARGV[2], 2)
local bad = {}
-- The version a string-layout value carries (`<version>:<bytes>`, or `<version>` for a tombstone).
local function version_of(s)
  local c = string.find(s, ':', 1, true)
  if c then return string.sub(s, 1, c - 1) end
  return s
end
local function wrong_type(r)
  return r.err and string.find(r.err, 'WRONGTYPE', 1, true)
end
-- Whether a key at version `have` (false: absent) is as expected; `want` is the version alone.
local function as_expected(kind, want, have)
  if kind == 97 then return not have end
  if kind == 116 or kind == 119 then return (not have) or have == want end
  return have == want
end
local function set(k, op, val)
  if op == 112 then redis.call('SET', k, val)
  elseif op == 108 then redis.call('SET', k, val, 'PX', life)
  else redis.call('SET', k, val, 'PX', ttl) end
end
local function hset(k, op, bytes, was_tombstone)
  if op == 100 or op == 101 then
    redis.call('DEL', k)
    redis.call('HSET', k, 'ver', v)
    redis.call('PEXPIRE', k, ttl)
  else
    redis.call('HSET', k, 'v', bytes, 'ver', v)
    if op == 120 then redis.call('PEXPIRE', k, ttl)
    elseif op == 108 then redis.call('PEXPIRE', k, life)
    elseif was_tombstone then redis.call('PERSIST', k) end
  end
end
for i = 1, n do
  local k = KEYS[i + 1]
  local a = ARGV[3 * i]
  local op, join, kind = string.byte(a, 1, 3)
  local want = ARGV[3 * i + 1]
  local ok, created = false, false
  local prior = nil
  if done then prior = done[k] end
  if prior ~= nil then
    ok = prior
    if ok then
      if strings then
        if op == 100 or op == 101 then set(k, op, v) else set(k, op, ARGV[3 * i + 2]) end
      else
        hset(k, op, ARGV[3 * i + 2], true)
      end
    end
  elseif strings then
    -- `want` is `<version>:` for a record, `<version>` for a tombstone.
    local val = v
    if op ~= 100 and op ~= 101 then val = ARGV[3 * i + 2] end
    local old
    if op == 112 then old = redis.pcall('SET', k, val, 'GET')
    elseif op == 108 then old = redis.pcall('SET', k, val, 'PX', life, 'GET')
    else old = redis.pcall('SET', k, val, 'PX', ttl, 'GET') end
    if type(old) == 'table' then
      if not wrong_type(old) then return old end
      -- A hash: the older layout, nothing written yet.
      local have = redis.call('HGET', k, 'ver')
      local w = want
      if kind == 114 or kind == 119 then w = string.sub(want, 1, -2) end
      ok = as_expected(kind, w, have)
      if ok then
        redis.call('DEL', k)
        set(k, op, val)
        created = not have
      end
    else
      if kind == 97 then ok = not old
      elseif not old then ok = kind == 116 or kind == 119
      elseif kind == 116 then ok = old == want
      else ok = string.find(old, want, 1, true) == 1 end
      created = not old
      if not ok then
        -- Put back what was there.
        if not old then
          redis.call('DEL', k)
        elseif op == 120 or op == 101 or not string.find(old, ':', 1, true) then
          redis.call('SET', k, old, 'PX', ttl)
        elseif op == 108 then
          redis.call('SET', k, old, 'PX', life)
        else
          redis.call('SET', k, old)
        end
      end
    end
  else
    local have = redis.pcall('HGET', k, 'ver')
    local was_string = false
    if type(have) == 'table' then
      if not wrong_type(have) then return have end
      -- A string: the newer layout, written while the cluster spoke a newer protocol.
      have = version_of(redis.call('GET', k))
      was_string = true
    end
    ok = as_expected(kind, want, have)
    if ok then
      if was_string then redis.call('DEL', k) end
      created = not have
      hset(k, op, ARGV[3 * i + 2], kind == 116)
    end
  end
  if done then done[k] = ok end
  if not ok then
    bad[#bad + 1] = i
  elseif join == 43 or (join == 61 and created) then
    redis.call('SADD', string.sub(a, 4), k)
  end
end
return {redis.call('INCR', KEYS[1]), bad}
"#;

/// Drop from an index set (`KEYS[1]`) the members (`KEYS[2..]`) whose record is gone, checked here
/// in one script: a record created again since the count found it gone stays indexed (its
/// creator's `SADD` came before this `SREM` otherwise, and its rewrites add nothing).
const UNINDEX: &str = r#"
local gone = 0
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('SREM', KEYS[1], KEYS[i])
    gone = gone + 1
  end
end
return gone
"#;
pub(super) static UNINDEX_SCRIPT: std::sync::LazyLock<::redis::Script> = std::sync::LazyLock::new(|| ::redis::Script::new(UNINDEX));

/// The script, with its SHA-1 (sent as `EVALSHA`; loaded again when Redis answers NOSCRIPT,
/// after a restart).
pub(super) static APPLY_SCRIPT: std::sync::LazyLock<::redis::Script> = std::sync::LazyLock::new(|| ::redis::Script::new(APPLY));

/// Take the gauge lease (`KEYS[1]`) for holder `ARGV[1]` for `ARGV[2]` ms when nobody holds it
/// or this holder does (a renewal); 1 when held by this holder after the call.
const LEASE: &str = r#"
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"#;
pub(super) static LEASE_SCRIPT: std::sync::LazyLock<::redis::Script> = std::sync::LazyLock::new(|| ::redis::Script::new(LEASE));

/// The announce script. `KEYS[1]` is the hash of announcements (a field per instance: `<protocol>:
/// <expiry, ms of the server's clock>`); `ARGV[1]` the instance, `ARGV[2]` its protocol, `ARGV[3]` how
/// long the announcement lives (ms). Renews this instance's announcement, removes the expired
/// (and any that does not parse) and answers the lowest protocol announced. The hash itself
/// expires with the latest announcement (not this one's: a shorter one must not take the others
/// with it), so a store no instance uses keeps none.
const ANNOUNCE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. (now + ttl))
local low = tonumber(ARGV[2])
local last = now + ttl
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local v, exp = string.match(all[i + 1], '^(%d+):(%d+)$')
  if (not v) or tonumber(exp) < now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    if tonumber(v) < low then low = tonumber(v) end
    if tonumber(exp) > last then last = tonumber(exp) end
  end
end
redis.call('PEXPIRE', KEYS[1], last - now)
return low
"#;
pub(super) static ANNOUNCE_SCRIPT: std::sync::LazyLock<::redis::Script> = std::sync::LazyLock::new(|| ::redis::Script::new(ANNOUNCE));

package resp

import (
	"crypto/subtle"
	"errors"
	"github.com/gd2fs/gd2fs/internal/authlimit"
	"strconv"
	"strings"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// spec describes a command as Redis's command table does: arity counts the
// name (negative: at least that many), noAuth commands run before AUTH.
type spec struct {
	name   string
	arity  int
	fn     func(c *conn, args [][]byte) error
	noAuth bool
	// txControl commands run at once inside MULTI instead of being queued.
	txControl bool
	flags     []string
	key       [3]int // first key, last key, step (COMMAND INFO)
	group     string
	summary   string
}

var commands map[string]*spec

func init() {
	list := []*spec{
		{name: "get", arity: 2, fn: (*conn).get, flags: []string{"readonly", "fast"}, key: [3]int{1, 1, 1}, group: "string", summary: "Returns the string value of a key."},
		{name: "set", arity: -3, fn: (*conn).set, flags: []string{"write", "denyoom"}, key: [3]int{1, 1, 1}, group: "string", summary: "Sets the string value of a key, ignoring its type. The key is created if it doesn't exist."},
		{name: "mget", arity: -2, fn: (*conn).mget, flags: []string{"readonly", "fast"}, key: [3]int{1, -1, 1}, group: "string", summary: "Atomically returns the string values of one or more keys (not atomic in gd2fs)."},
		{name: "mset", arity: -3, fn: (*conn).mset, flags: []string{"write", "denyoom"}, key: [3]int{1, -1, 2}, group: "string", summary: "Sets the string values of one or more keys (not atomic in gd2fs)."},
		{name: "exists", arity: -2, fn: (*conn).exists, flags: []string{"readonly", "fast"}, key: [3]int{1, -1, 1}, group: "generic", summary: "Determines whether one or more keys exist."},
		{name: "del", arity: -2, fn: (*conn).del, flags: []string{"write"}, key: [3]int{1, -1, 1}, group: "generic", summary: "Deletes one or more keys."},
		{name: "unlink", arity: -2, fn: (*conn).del, flags: []string{"write", "fast"}, key: [3]int{1, -1, 1}, group: "generic", summary: "Deletes one or more keys."},
		{name: "strlen", arity: 2, fn: (*conn).strlen, flags: []string{"readonly", "fast"}, key: [3]int{1, 1, 1}, group: "string", summary: "Returns the length of a string value."},
		{name: "getrange", arity: 4, fn: (*conn).getrange, flags: []string{"readonly"}, key: [3]int{1, 1, 1}, group: "string", summary: "Returns a substring of the string stored at a key."},
		{name: "type", arity: 2, fn: (*conn).typ, flags: []string{"readonly", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Determines the type of value stored at a key."},
		{name: "ttl", arity: 2, fn: (*conn).ttlCmd, flags: []string{"readonly", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Returns the expiration time in seconds of a key."},
		{name: "pttl", arity: 2, fn: (*conn).ttlCmd, flags: []string{"readonly", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Returns the expiration time in milliseconds of a key."},
		{name: "expiretime", arity: 2, fn: (*conn).ttlCmd, flags: []string{"readonly", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Returns the expiration time of a key as a Unix timestamp."},
		{name: "pexpiretime", arity: 2, fn: (*conn).ttlCmd, flags: []string{"readonly", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Returns the expiration time of a key as a Unix milliseconds timestamp."},
		{name: "expire", arity: -3, fn: (*conn).expireCmd, flags: []string{"write", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Sets the expiration time of a key in seconds."},
		{name: "pexpire", arity: -3, fn: (*conn).expireCmd, flags: []string{"write", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Sets the expiration time of a key in milliseconds."},
		{name: "expireat", arity: -3, fn: (*conn).expireCmd, flags: []string{"write", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Sets the expiration time of a key to a Unix timestamp."},
		{name: "pexpireat", arity: -3, fn: (*conn).expireCmd, flags: []string{"write", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Sets the expiration time of a key to a Unix milliseconds timestamp."},
		{name: "persist", arity: 2, fn: (*conn).persist, flags: []string{"write", "fast"}, key: [3]int{1, 1, 1}, group: "generic", summary: "Removes the expiration time of a key."},
		{name: "scan", arity: -2, fn: (*conn).scan, flags: []string{"readonly"}, group: "generic", summary: "Iterates over the key names in the database."},
		{name: "dbsize", arity: 1, fn: (*conn).dbsize, flags: []string{"readonly", "fast"}, group: "server", summary: "Returns the number of keys in the database."},
		{name: "hello", arity: -1, fn: (*conn).hello, noAuth: true, flags: []string{"noscript", "loading", "stale", "fast", "no_auth"}, group: "connection", summary: "Handshakes with the Redis server."},
		{name: "auth", arity: -2, fn: (*conn).auth, noAuth: true, flags: []string{"noscript", "loading", "stale", "fast", "no_auth"}, group: "connection", summary: "Authenticates the connection."},
		{name: "ping", arity: -1, fn: (*conn).ping, flags: []string{"fast"}, group: "connection", summary: "Returns the server's liveliness response."},
		{name: "echo", arity: 2, fn: (*conn).echo, flags: []string{"fast"}, group: "connection", summary: "Returns the given string."},
		{name: "select", arity: 2, fn: (*conn).sel, flags: []string{"loading", "stale", "fast"}, group: "connection", summary: "Changes the selected database (only 0 exists)."},
		{name: "client", arity: -2, fn: (*conn).client, flags: []string{"loading", "stale"}, group: "connection", summary: "A container for client connection commands."},
		{name: "quit", arity: -1, fn: (*conn).quit, noAuth: true, txControl: true, flags: []string{"fast", "no_auth"}, group: "connection", summary: "Closes the connection."},
		{name: "reset", arity: 1, fn: (*conn).reset, noAuth: true, txControl: true, flags: []string{"fast", "no_auth"}, group: "connection", summary: "Resets the connection."},
		{name: "command", arity: -1, fn: (*conn).command, flags: []string{"loading", "stale"}, group: "server", summary: "Returns detailed information about all commands."},
		{name: "info", arity: -1, fn: (*conn).info, flags: []string{"loading", "stale"}, group: "server", summary: "Returns information and statistics about the server."},
		{name: "multi", arity: 1, fn: (*conn).multiCmd, txControl: true, flags: []string{"noscript", "loading", "stale", "fast"}, group: "transactions", summary: "Starts a transaction (queued, run at EXEC; not atomic in gd2fs)."},
		{name: "exec", arity: 1, fn: (*conn).execCmd, txControl: true, flags: []string{"noscript", "loading", "stale"}, group: "transactions", summary: "Executes all commands in a transaction (one after the other; not atomic in gd2fs)."},
		{name: "discard", arity: 1, fn: (*conn).discardCmd, txControl: true, flags: []string{"noscript", "loading", "stale", "fast"}, group: "transactions", summary: "Discards a transaction."},
		{name: "config", arity: -2, fn: (*conn).config, flags: []string{"admin", "loading", "stale"}, group: "server", summary: "A container for server configuration commands."},
	}
	commands = make(map[string]*spec, len(list))
	for _, s := range list {
		commands[s.name] = s
	}
}

// lower returns an ASCII-lowercased copy of b, as a string.
func lower(b []byte) string {
	out := []byte(nil)
	for i, ch := range b {
		if 'A' <= ch && ch <= 'Z' {
			if out == nil {
				out = append([]byte(nil), b...)
			}
			out[i] = ch + 'a' - 'A'
		}
	}
	if out == nil {
		return string(b)
	}
	return string(out)
}

// exec runs one command. It returns quit=true after QUIT, and an error only
// when the connection broke while a reply was being written.
func (c *conn) exec(cmd *command) (quit bool, err error) {
	name := lower(cmd.args[0])
	sp := commands[name]
	msg := ""
	switch {
	case sp == nil:
		// Redis's wording (server.c, processCommand), which clients and
		// people grep for.
		var args strings.Builder
		for _, a := range cmd.args[1:] {
			if args.Len() >= 128 {
				break
			}
			a = a[:min(len(a), 128-args.Len())]
			args.WriteString("'" + string(a) + "' ")
		}
		msg = "ERR unknown command '" + trunc(string(cmd.args[0]), 128) + "', with args beginning with: " + args.String()
	case (sp.arity > 0 && len(cmd.args) != sp.arity) || len(cmd.args) < -sp.arity:
		msg = "ERR wrong number of arguments for '" + sp.name + "' command"
	case !c.authed && !sp.noAuth:
		msg = "NOAUTH Authentication required."
	case cmd.skipped > 0:
		c.s.refusedValues.Add(1)
		msg = "ERR value of " + strconv.FormatInt(cmd.skipped, 10) + " bytes is over this server's limit of " +
			strconv.FormatInt(c.s.cfg.Limits.MaxValue, 10) + " bytes (gd2fs server --kv-max-value)"
	}
	if cmd.res != nil && msg == "" && (c.multi != nil || sp.name != "set") {
		cmd.materialize() // only set itself takes a value from reserved pages
	}
	if c.multi != nil && (sp == nil || !sp.txControl) {
		// Inside MULTI: queue (Redis answers +QUEUED), or remember that
		// the transaction is doomed (EXECABORT at EXEC).
		if msg != "" {
			c.multiErr = true
			c.w.error(msg)
			return false, nil
		}
		args := make([][]byte, len(cmd.args))
		for i, a := range cmd.args {
			args[i] = append([]byte(nil), a...) // the reader reuses its buffers
		}
		c.multi = append(c.multi, args)
		c.w.simple("QUEUED")
		return false, nil
	}
	if msg != "" {
		c.w.error(msg)
		return false, nil
	}
	c.res, c.resCRC = cmd.res, cmd.resCRC
	err = sp.fn(c, cmd.args)
	c.res = nil
	if errors.Is(err, errQuit) {
		return true, nil
	}
	return false, err
}

// multi starts a transaction. gd2fs queues the commands and runs them at
// EXEC one after the other: the replies come back together, as Redis
// clients expect (redis-py's default pipeline is a MULTI/EXEC), but
// other clients' commands may run in between: not atomic (docs/resp.md).
func (c *conn) multiCmd(args [][]byte) error {
	if c.multi != nil {
		c.w.error("ERR MULTI calls can not be nested")
		return nil
	}
	c.multi, c.multiErr = [][][]byte{}, false
	c.w.simple("OK")
	return nil
}

func (c *conn) execCmd(args [][]byte) error {
	if c.multi == nil {
		c.w.error("ERR EXEC without MULTI")
		return nil
	}
	queued, failed := c.multi, c.multiErr
	c.multi, c.multiErr = nil, false
	if failed {
		c.w.error("EXECABORT Transaction discarded because of previous errors.")
		return nil
	}
	c.w.array(len(queued))
	for _, q := range queued {
		if err := commands[lower(q[0])].fn(c, q); err != nil && !errors.Is(err, errQuit) {
			return err
		}
	}
	return nil
}

func (c *conn) discardCmd(args [][]byte) error {
	if c.multi == nil {
		c.w.error("ERR DISCARD without MULTI")
		return nil
	}
	c.multi, c.multiErr = nil, false
	c.w.simple("OK")
	return nil
}

var errQuit = errors.New("quit")

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// keyError says why a key cannot be a gd2fs key ("" when it can).
func keyError(k []byte) string {
	if len(k) == 0 || len(k) > 1024 {
		return "ERR gd2fs keys are 1 to 1024 bytes long; this one has " + strconv.Itoa(len(k))
	}
	return ""
}

// miss: the key is not stored, or its owner cannot be reached (recomputable
// KV cache: the engine computes it again).
func miss(err error) bool {
	return errors.Is(err, errs.ErrNotFound) || errors.Is(err, errs.ErrUnavailable)
}

// backendError turns a backend failure into a Redis error reply.
func (c *conn) backendError(err error) {
	msg := err.Error()
	switch {
	case errors.Is(err, errs.ErrNoSpace):
		c.w.error("OOM " + msg)
	case errors.Is(err, errs.ErrUnavailable):
		c.w.error("TRYAGAIN " + msg)
	default:
		c.w.error("ERR " + msg)
	}
}

func (c *conn) get(args [][]byte) error {
	return c.getOne(args[1], false)
}

// getOne answers one value, or null; inArray: a miss of any kind is null
// (MGET never fails per key).
func (c *conn) getOne(key []byte, inArray bool) error {
	if e := keyError(key); e != "" {
		if inArray {
			c.w.null()
			return nil
		}
		c.w.error(e)
		return nil
	}
	var werr error
	wrote := false
	err := c.s.cfg.Backend.Get(c.s.ctx, key, func(bufs [][]byte, n int) error {
		wrote = true
		c.s.bytesOut.Add(int64(n))
		werr = c.w.bulkViews(bufs, n)
		return werr
	})
	switch {
	case wrote:
		if werr != nil {
			return werr
		}
		c.s.hits.Add(1)
	case miss(err):
		c.s.misses.Add(1)
		if errors.Is(err, errs.ErrUnavailable) {
			c.s.unreachable.Add(1)
		}
		c.w.null()
	case inArray:
		c.w.null()
	default:
		c.backendError(err)
	}
	return nil
}

func (c *conn) set(args [][]byte) error {
	key, val := args[1], args[2]
	var nx, xx, get, keepTTL bool
	var when int64 // unix ms to expire at; 0: no TTL
	expOpt := ""   // the one of EX, PX, EXAT, PXAT, KEEPTTL given
	for i := 3; i < len(args); i++ {
		switch opt := lower(args[i]); opt {
		case "nx":
			nx = true
		case "xx":
			xx = true
		case "get":
			get = true
		case "keepttl", "ex", "px", "exat", "pxat":
			if expOpt != "" || (opt != "keepttl" && i+1 >= len(args)) {
				c.w.error("ERR syntax error")
				return nil
			}
			expOpt = opt
			if opt == "keepttl" {
				keepTTL = true
				continue
			}
			i++
			unit, base := int64(1000), timeNow().UnixMilli()
			if opt == "px" || opt == "pxat" {
				unit = 1
			}
			if opt == "exat" || opt == "pxat" {
				base = 0
			}
			var ok bool
			if when, ok = c.expireAt(args[i], unit, base, "set", true); !ok {
				return nil
			}
		default:
			c.w.error("ERR syntax error")
			return nil
		}
	}
	switch {
	case nx && xx:
		c.w.error("ERR syntax error")
		return nil
	case get:
		c.w.error("ERR SET with GET is not supported by gd2fs: GET the key first")
		return nil
	}
	if e := keyError(key); e != "" {
		c.w.error(e)
		return nil
	}
	var keep client.Retention
	if xx || keepTTL {
		// Not atomic: a client racing this SET may create or delete the
		// key in between (docs/resp.md).
		r, err := c.s.cfg.Backend.Retention(c.s.ctx, key)
		switch {
		case miss(err) && xx:
			c.w.null()
			return nil
		case err != nil && !miss(err):
			c.backendError(err)
			return nil
		}
		keep = r
	}
	var existed bool
	var err error
	size := int64(len(val))
	if c.res != nil {
		// The value is in the store's pages already (reader.direct).
		size = c.res.Size()
		existed, err = c.s.cfg.Backend.(reserver).PutReserved(c.s.ctx, key, c.res, c.resCRC, !nx)
		c.s.setsIntoDRAM.Add(1)
	} else {
		existed, err = c.s.cfg.Backend.Put(c.s.ctx, key, val, !nx)
	}
	switch {
	case err != nil:
		c.backendError(err)
		return nil
	case nx && existed:
		c.w.null()
		return nil
	}
	// The put stored a block without a TTL: give it the one asked for, or
	// (KEEPTTL) the one it had.
	o := client.RetainOptions{SetTTL: when != 0, TTL: ttlFrom(when)}
	if keepTTL && keep.TTL > 0 {
		o = client.RetainOptions{SetTTL: true, TTL: keep.TTL}
	}
	if o.SetTTL {
		if _, _, err := c.s.cfg.Backend.Retain(c.s.ctx, key, o); err != nil {
			// A value meant to expire must not stay without its TTL.
			if _, derr := c.s.cfg.Backend.Delete(c.s.ctx, key); derr != nil {
				c.s.cfg.Log.Warn("SET with a TTL: the TTL failed and the value could not be deleted", "err", derr)
			}
			c.backendError(err)
			return nil
		}
	}
	c.s.bytesIn.Add(size)
	c.w.simple("OK")
	return nil
}

func (c *conn) mget(args [][]byte) error {
	c.w.array(len(args) - 1)
	for _, k := range args[1:] {
		if err := c.getOne(k, true); err != nil {
			return err
		}
	}
	return nil
}

func (c *conn) mset(args [][]byte) error {
	if len(args)%2 != 1 {
		c.w.error("ERR wrong number of arguments for 'mset' command")
		return nil
	}
	for i := 1; i < len(args); i += 2 {
		if e := keyError(args[i]); e != "" {
			c.w.error(e)
			return nil
		}
	}
	for i := 1; i < len(args); i += 2 {
		if _, err := c.s.cfg.Backend.Put(c.s.ctx, args[i], args[i+1], true); err != nil {
			c.backendError(err)
			return nil
		}
		c.s.bytesIn.Add(int64(len(args[i+1])))
	}
	c.w.simple("OK")
	return nil
}

func (c *conn) exists(args [][]byte) error {
	n := int64(0)
	for _, k := range args[1:] {
		if keyError(k) != "" {
			continue
		}
		_, err := c.s.cfg.Backend.Stat(c.s.ctx, k)
		switch {
		case err == nil:
			n++
			c.prefetchHit(k)
		case !miss(err):
			c.backendError(err)
			return nil
		}
	}
	c.w.int(n)
	return nil
}

func (c *conn) del(args [][]byte) error {
	n := int64(0)
	for _, k := range args[1:] {
		if keyError(k) != "" {
			continue
		}
		found, err := c.s.cfg.Backend.Delete(c.s.ctx, k)
		if err != nil {
			// An owner that is down may still hold the key: say so
			// rather than count it as deleted.
			c.backendError(err)
			return nil
		}
		if found {
			n++
		}
	}
	c.w.int(n)
	return nil
}

func (c *conn) strlen(args [][]byte) error {
	if e := keyError(args[1]); e != "" {
		c.w.error(e)
		return nil
	}
	n, err := c.s.cfg.Backend.Stat(c.s.ctx, args[1])
	switch {
	case err == nil:
		c.w.int(n)
	case miss(err):
		c.w.int(0)
	default:
		c.backendError(err)
	}
	return nil
}

func (c *conn) getrange(args [][]byte) error {
	start, err1 := strconv.ParseInt(string(args[2]), 10, 64)
	end, err2 := strconv.ParseInt(string(args[3]), 10, 64)
	if err1 != nil || err2 != nil {
		c.w.error("ERR value is not an integer or out of range")
		return nil
	}
	if e := keyError(args[1]); e != "" {
		c.w.error(e)
		return nil
	}
	var werr error
	wrote := false
	err := c.s.cfg.Backend.Get(c.s.ctx, args[1], func(bufs [][]byte, n int) error {
		wrote = true
		from, to := rangeOf(start, end, int64(n))
		werr = c.w.bulkViews(cut(bufs, from, to), int(to-from))
		return werr
	})
	switch {
	case wrote:
		return werr
	case miss(err):
		c.w.bulk(nil) // Redis: "" for a missing key
	default:
		c.backendError(err)
	}
	return nil
}

// rangeOf applies GETRANGE's index rules (negative from the end, clamped)
// to a value of n bytes and returns [from, to).
func rangeOf(start, end, n int64) (int64, int64) {
	if start < 0 && end < 0 && start > end {
		return 0, 0
	}
	if start < 0 {
		start += n
	}
	if end < 0 {
		end += n
	}
	start, end = max(start, 0), max(end, 0)
	end = min(end, n-1)
	if n == 0 || start > end {
		return 0, 0
	}
	return start, end + 1
}

// cut returns the views of bytes [from, to) of the concatenation of bufs.
func cut(bufs [][]byte, from, to int64) [][]byte {
	var out [][]byte
	pos := int64(0)
	for _, b := range bufs {
		lo, hi := pos, pos+int64(len(b))
		pos = hi
		if hi <= from || lo >= to {
			continue
		}
		out = append(out, b[max(from-lo, 0):min(to, hi)-lo])
	}
	return out
}

func (c *conn) typ(args [][]byte) error {
	if keyError(args[1]) == "" {
		if _, err := c.s.cfg.Backend.Stat(c.s.ctx, args[1]); err == nil {
			c.w.simple("string")
			return nil
		}
	}
	c.w.simple("none")
	return nil
}

func (c *conn) scan(args [][]byte) error {
	cursor, err := strconv.ParseUint(string(args[1]), 10, 64)
	if err != nil {
		c.w.error("ERR invalid cursor")
		return nil
	}
	count, match, typ := 10, "", ""
	for i := 2; i < len(args); i += 2 {
		if i+1 >= len(args) {
			c.w.error("ERR syntax error")
			return nil
		}
		switch lower(args[i]) {
		case "count":
			n, err := strconv.ParseInt(string(args[i+1]), 10, 64)
			if err != nil {
				c.w.error("ERR value is not an integer or out of range")
				return nil
			}
			if n < 1 {
				c.w.error("ERR syntax error")
				return nil
			}
			count = int(min(n, 100000))
		case "match":
			match = string(args[i+1])
		case "type":
			typ = lower(args[i+1])
		default:
			c.w.error("ERR syntax error")
			return nil
		}
	}
	keys, next, err := c.s.cfg.Backend.Scan(c.s.ctx, cursor, count)
	if err != nil {
		c.backendError(err)
		return nil
	}
	out := keys[:0]
	for _, k := range keys {
		if (match == "" || globMatch(match, k)) && (typ == "" || typ == "string") {
			out = append(out, k)
		}
	}
	c.w.array(2)
	c.w.bulkString(strconv.FormatUint(next, 10))
	c.w.array(len(out))
	for _, k := range out {
		c.w.bulkString(k)
	}
	return nil
}

func (c *conn) dbsize(args [][]byte) error {
	n, err := c.s.cfg.Backend.Count(c.s.ctx)
	if err != nil {
		c.backendError(err)
		return nil
	}
	c.w.int(n)
	return nil
}

// checkToken compares a password with the cluster token in constant time.
// An address that failed too often is refused without a comparison for a
// while (authlimit): AUTH on one connection allowed ~300k guesses a second.
func (c *conn) checkToken(pass []byte) bool {
	if c.s.cfg.Token == "" {
		return true // a cluster without a token accepts anyone, as the binary protocol does
	}
	host := authlimit.Host(c.nc.RemoteAddr().String())
	if ok, _ := c.s.guesses.Allow(host); !ok {
		return false
	}
	if subtle.ConstantTimeCompare(pass, []byte(c.s.cfg.Token)) == 1 {
		return true
	}
	c.s.guesses.Fail(host)
	return false
}

func (c *conn) setAuthed(ok bool) {
	c.authed = ok
	c.r.authed = ok
}

func (c *conn) auth(args [][]byte) error {
	if len(args) > 3 {
		c.w.error("ERR syntax error")
		return nil
	}
	// AUTH password, or AUTH username password: any user name is accepted,
	// the password is the cluster token.
	if !c.checkToken(args[len(args)-1]) {
		c.w.error("WRONGPASS invalid username-password pair or user is disabled.")
		return nil
	}
	c.setAuthed(true)
	c.w.simple("OK")
	return nil
}

func (c *conn) hello(args [][]byte) error {
	proto := c.w.proto
	if len(args) > 1 {
		v, err := strconv.ParseInt(string(args[1]), 10, 64)
		if err != nil {
			c.w.error("ERR Protocol version is not an integer or out of range")
			return nil
		}
		if v != 2 && v != 3 {
			c.w.error("NOPROTO unsupported protocol version")
			return nil
		}
		proto = int(v)
	}
	var name []byte
	setName := false
	for i := 2; i < len(args); i++ {
		switch opt := lower(args[i]); {
		case opt == "auth" && i+2 < len(args):
			if !c.checkToken(args[i+2]) {
				c.w.error("WRONGPASS invalid username-password pair or user is disabled.")
				return nil
			}
			c.setAuthed(true)
			i += 2
		case opt == "setname" && i+1 < len(args):
			name, setName = args[i+1], true
			i++
		default:
			c.w.error("ERR Syntax error in HELLO option '" + string(args[i]) + "'")
			return nil
		}
	}
	if !c.authed {
		c.w.error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
		return nil
	}
	if setName {
		if !validName(name) {
			c.w.error("ERR Client names cannot contain spaces, newlines or special characters.")
			return nil
		}
		c.name = string(name)
	}
	c.w.proto = proto
	c.w.mapHeader(7)
	c.w.bulkString("server")
	c.w.bulkString("gd2fs")
	c.w.bulkString("version")
	c.w.bulkString(redisVersion)
	c.w.bulkString("proto")
	c.w.int(int64(proto))
	c.w.bulkString("id")
	c.w.int(c.id)
	c.w.bulkString("mode")
	c.w.bulkString("standalone")
	c.w.bulkString("role")
	c.w.bulkString("master")
	c.w.bulkString("modules")
	c.w.array(0)
	return nil
}

// redisVersion is the Redis version whose protocol and commands this
// server follows (clients gate features on it).
const redisVersion = "7.0.0"

func validName(b []byte) bool {
	for _, ch := range b {
		if ch < '!' || ch > '~' {
			return false
		}
	}
	return true
}

func (c *conn) ping(args [][]byte) error {
	switch len(args) {
	case 1:
		c.w.simple("PONG")
	case 2:
		c.w.bulk(args[1])
	default:
		c.w.error("ERR wrong number of arguments for 'ping' command")
	}
	return nil
}

func (c *conn) echo(args [][]byte) error {
	c.w.bulk(args[1])
	return nil
}

func (c *conn) sel(args [][]byte) error {
	n, err := strconv.ParseInt(string(args[1]), 10, 64)
	switch {
	case err != nil:
		c.w.error("ERR value is not an integer or out of range")
	case n != 0:
		c.w.error("ERR DB index is out of range")
	default:
		c.w.simple("OK")
	}
	return nil
}

func (c *conn) client(args [][]byte) error {
	sub := lower(args[1])
	wrongArgs := func() error {
		c.w.error("ERR wrong number of arguments for 'client|" + sub + "' command")
		return nil
	}
	switch sub {
	case "setname":
		if len(args) != 3 {
			return wrongArgs()
		}
		if !validName(args[2]) {
			c.w.error("ERR Client names cannot contain spaces, newlines or special characters.")
			return nil
		}
		c.name = string(args[2])
		c.w.simple("OK")
	case "getname":
		if len(args) != 2 {
			return wrongArgs()
		}
		if c.name == "" {
			c.w.null()
		} else {
			c.w.bulkString(c.name)
		}
	case "id":
		if len(args) != 2 {
			return wrongArgs()
		}
		c.w.int(c.id)
	case "setinfo":
		if len(args) != 4 {
			return wrongArgs()
		}
		switch lower(args[2]) {
		case "lib-name":
			c.lib[0] = string(args[3])
		case "lib-ver":
			c.lib[1] = string(args[3])
		default:
			c.w.error("ERR Unrecognized option '" + string(args[2]) + "'")
			return nil
		}
		c.w.simple("OK")
	case "info":
		c.w.bulkString(c.describe() + "\n")
	case "list":
		c.s.mu.Lock()
		var b strings.Builder
		for o := range c.s.conns {
			b.WriteString(o.describe() + "\n")
		}
		c.s.mu.Unlock()
		c.w.bulkString(b.String())
	case "no-evict", "no-touch":
		c.w.simple("OK") // probes never pin or refresh gd2fs blocks anyway
	default:
		c.w.error("ERR unknown subcommand '" + trunc(string(args[1]), 128) + "'. Try CLIENT HELP.")
	}
	return nil
}

func (c *conn) describe() string {
	return "id=" + strconv.FormatInt(c.id, 10) + " addr=" + c.nc.RemoteAddr().String() + " laddr=" + c.nc.LocalAddr().String() +
		" name=" + c.name + " age=" + strconv.FormatInt(int64(timeSince(c.since).Seconds()), 10) + " db=0 resp=" + strconv.Itoa(c.w.proto) +
		" lib-name=" + c.lib[0] + " lib-ver=" + c.lib[1]
}

func (c *conn) quit(args [][]byte) error {
	c.w.simple("OK")
	return errQuit
}

func (c *conn) reset(args [][]byte) error {
	c.multi, c.multiErr = nil, false
	c.w.proto = 2
	c.name = ""
	c.lib = [2]string{}
	c.setAuthed(c.s.cfg.Token == "")
	c.w.simple("RESET")
	return nil
}

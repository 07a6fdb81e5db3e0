package resp

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

var timeSince = time.Since

// sortedCommands lists the command table by name.
func sortedCommands() []*spec {
	out := make([]*spec, 0, len(commands))
	for _, s := range commands {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *spec) int { return strings.Compare(a.name, b.name) })
	return out
}

// commandInfo writes one COMMAND INFO entry in Redis 7's 10-field form.
func (c *conn) commandInfo(s *spec) {
	c.w.array(10)
	c.w.bulkString(s.name)
	c.w.int(int64(s.arity))
	c.w.setHeader(len(s.flags))
	for _, f := range s.flags {
		c.w.simple(f)
	}
	c.w.int(int64(s.key[0]))
	c.w.int(int64(s.key[1]))
	c.w.int(int64(s.key[2]))
	c.w.setHeader(0) // ACL categories
	c.w.setHeader(0) // tips
	c.w.array(0)     // key specifications
	c.w.array(0)     // subcommands
}

func (c *conn) command(args [][]byte) error {
	if len(args) == 1 {
		all := sortedCommands()
		c.w.array(len(all))
		for _, s := range all {
			c.commandInfo(s)
		}
		return nil
	}
	switch sub := lower(args[1]); sub {
	case "count":
		c.w.int(int64(len(commands)))
	case "list":
		all := sortedCommands()
		c.w.array(len(all))
		for _, s := range all {
			c.w.bulkString(s.name)
		}
	case "info":
		names := args[2:]
		if len(names) == 0 {
			all := sortedCommands()
			c.w.array(len(all))
			for _, s := range all {
				c.commandInfo(s)
			}
			return nil
		}
		c.w.array(len(names))
		for _, n := range names {
			if s := commands[lower(n)]; s != nil {
				c.commandInfo(s)
			} else {
				c.w.null()
			}
		}
	case "docs":
		// Enough for redis-cli's interactive hints: summary, since, group.
		var list []*spec
		if len(args) == 2 {
			list = sortedCommands()
		} else {
			for _, n := range args[2:] {
				if s := commands[lower(n)]; s != nil {
					list = append(list, s)
				}
			}
		}
		c.w.mapHeader(len(list))
		for _, s := range list {
			c.w.bulkString(s.name)
			c.w.mapHeader(3)
			c.w.bulkString("summary")
			c.w.bulkString(s.summary)
			c.w.bulkString("since")
			c.w.bulkString("1.0.0")
			c.w.bulkString("group")
			c.w.bulkString(s.group)
		}
	case "getkeys":
		if len(args) < 3 {
			c.w.error("ERR wrong number of arguments for 'command|getkeys' command")
			return nil
		}
		s := commands[lower(args[2])]
		if s == nil || s.key[0] == 0 {
			c.w.error("ERR Invalid command specified")
			return nil
		}
		rest := args[2:]
		var keys [][]byte
		last := s.key[1]
		if last < 0 {
			last = len(rest) + last
		}
		for i := s.key[0]; i <= last && i < len(rest); i += s.key[2] {
			keys = append(keys, rest[i])
		}
		c.w.array(len(keys))
		for _, k := range keys {
			c.w.bulk(k)
		}
	default:
		c.w.error("ERR unknown subcommand '" + trunc(string(args[1]), 128) + "'. Try COMMAND HELP.")
	}
	return nil
}

// configParams are the parameters clients probe (redis-benchmark asks for
// save and appendonly; others for databases, maxmemory, timeouts).
func (c *conn) configParams() [][2]string {
	maxmem := int64(0)
	if c.s.cfg.Memory != nil {
		maxmem = c.s.cfg.Memory().Cap
	}
	return [][2]string{
		{"appendonly", "no"},
		{"databases", "1"},
		{"maxclients", strconv.Itoa(c.s.cfg.MaxClients)},
		{"maxmemory", strconv.FormatInt(maxmem, 10)},
		// The closest Redis name for gd2fs's S3-FIFO between DRAM and disk.
		{"maxmemory-policy", "allkeys-lru"},
		{"port", port(c.s.Addr())},
		{"proto-max-bulk-len", strconv.FormatInt(c.s.cfg.Limits.MaxValue, 10)},
		{"save", ""},
		{"timeout", "0"},
	}
}

func port(addr string) string {
	if i := strings.LastIndexByte(addr, ':'); i >= 0 {
		return addr[i+1:]
	}
	return addr
}

func (c *conn) config(args [][]byte) error {
	switch sub := lower(args[1]); sub {
	case "get":
		if len(args) < 3 {
			c.w.error("ERR wrong number of arguments for 'config|get' command")
			return nil
		}
		var out [][2]string
		for _, p := range c.configParams() {
			for _, pat := range args[2:] {
				if globMatch(strings.ToLower(string(pat)), p[0]) {
					out = append(out, p)
					break
				}
			}
		}
		c.w.mapHeader(len(out))
		for _, p := range out {
			c.w.bulkString(p[0])
			c.w.bulkString(p[1])
		}
	case "set":
		c.w.error("ERR CONFIG SET is not supported by gd2fs: configure the server with its flags (gd2fs server --help)")
	case "resetstat":
		for _, n := range []*atomic.Int64{&c.s.cmds, &c.s.hits, &c.s.misses, &c.s.unreachable, &c.s.bytesIn, &c.s.bytesOut, &c.s.protoErrors, &c.s.refusedValues, &c.s.rejected, &c.s.connsTotal, &c.s.setsIntoDRAM} {
			n.Store(0)
		}
		c.w.simple("OK")
	case "rewrite":
		c.w.error("ERR The server is running without a config file")
	default:
		c.w.error("ERR unknown subcommand '" + trunc(string(args[1]), 128) + "'. Try CONFIG HELP.")
	}
	return nil
}

func (c *conn) info(args [][]byte) error {
	want := map[string]bool{}
	for _, a := range args[1:] {
		want[lower(a)] = true
	}
	all := len(want) == 0 || want["all"] || want["everything"] || want["default"]
	var b strings.Builder
	section := func(name string) bool {
		if !all && !want[name] {
			return false
		}
		if b.Len() > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString("# " + strings.ToUpper(name[:1]) + name[1:] + "\r\n")
		return true
	}
	kv := func(k string, v any) { fmt.Fprintf(&b, "%s:%v\r\n", k, v) }
	s := c.s
	if section("server") {
		kv("redis_version", redisVersion)
		kv("gd2fs_role", s.cfg.Role)
		kv("redis_mode", "standalone")
		kv("os", runtime.GOOS+" "+runtime.GOARCH)
		kv("arch_bits", strconv.Itoa(strconv.IntSize))
		kv("go_version", runtime.Version())
		kv("process_id", os.Getpid())
		kv("tcp_port", port(s.Addr()))
		up := time.Since(s.start)
		kv("uptime_in_seconds", int64(up.Seconds()))
		kv("uptime_in_days", int64(up.Hours()/24))
	}
	if section("clients") {
		kv("connected_clients", s.clients.Load())
		kv("maxclients", s.cfg.MaxClients)
	}
	if section("memory") {
		var m MemoryInfo
		if s.cfg.Memory != nil {
			m = s.cfg.Memory()
		}
		kv("used_memory", m.Used)
		kv("maxmemory", m.Cap)
		kv("maxmemory_policy", "allkeys-lru")
		kv("gd2fs_kv_disk_used", m.DiskUsed)
		kv("gd2fs_kv_disk_capacity", m.DiskCap)
	}
	if section("stats") {
		kv("total_connections_received", s.connsTotal.Load())
		kv("total_commands_processed", s.cmds.Load())
		kv("rejected_connections", s.rejected.Load())
		kv("keyspace_hits", s.hits.Load())
		kv("keyspace_misses", s.misses.Load())
		kv("gd2fs_owner_unreachable_misses", s.unreachable.Load())
		kv("gd2fs_value_bytes_in", s.bytesIn.Load())
		kv("gd2fs_value_bytes_out", s.bytesOut.Load())
		kv("gd2fs_refused_values", s.refusedValues.Load())
		kv("gd2fs_sets_into_dram", s.setsIntoDRAM.Load())
		kv("total_error_replies_protocol", s.protoErrors.Load())
		kv("gd2fs_http_requests_refused", s.httpRefused.Load())
	}
	if section("keyspace") {
		if n, err := s.cfg.Backend.Count(s.ctx); err == nil && n > 0 {
			kv("db0", fmt.Sprintf("keys=%d,expires=0,avg_ttl=0", n))
		} else if err != nil {
			b.WriteString("# gd2fs: key count unavailable: " + strings.ReplaceAll(err.Error(), "\n", " ") + "\r\n")
		}
	}
	c.w.bulkString(b.String())
	return nil
}

// globMatch reports whether s matches the Redis glob pattern p (`*`, `?`,
// `[abc]`, `[^a]`, `[a-z]`, `\x`). It backtracks only to the last `*`, so
// it runs in O(len(p)·len(s)) whatever the pattern.
func globMatch(p, s string) bool {
	pi, si := 0, 0
	starP, starS := -1, 0
	for si < len(s) {
		if pi < len(p) {
			switch p[pi] {
			case '*':
				starP, starS = pi, si
				pi++
				continue
			case '?':
				pi++
				si++
				continue
			case '[':
				if ok, next := matchClass(p, pi, s[si]); ok {
					pi, si = next, si+1
					continue
				}
			case '\\':
				if pi+1 < len(p) && p[pi+1] == s[si] {
					pi, si = pi+2, si+1
					continue
				}
			default:
				if p[pi] == s[si] {
					pi++
					si++
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		starS++
		pi, si = starP+1, starS
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// matchClass matches ch against the class starting at p[i] == '['; next is
// the index after the closing ']'.
func matchClass(p string, i int, ch byte) (ok bool, next int) {
	i++
	neg := i < len(p) && p[i] == '^'
	if neg {
		i++
	}
	match := false
	for i < len(p) && p[i] != ']' {
		switch {
		case p[i] == '\\' && i+1 < len(p):
			if p[i+1] == ch {
				match = true
			}
			i += 2
		case i+2 < len(p) && p[i+1] == '-' && p[i+2] != ']':
			lo, hi := p[i], p[i+2]
			if lo > hi {
				lo, hi = hi, lo
			}
			if lo <= ch && ch <= hi {
				match = true
			}
			i += 3
		default:
			if p[i] == ch {
				match = true
			}
			i++
		}
	}
	if i >= len(p) {
		return false, i // unterminated class: no match
	}
	return match != neg, i + 1
}

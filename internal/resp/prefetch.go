package resp

import (
	"bytes"
	"context"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
)

// Prefetch on EXISTS (issue 23 item 3). An engine asks whether a request's
// chunks are cached when it schedules the request and reads them a little
// later; with prefetch on, each EXISTS hit found on a server's disk tier is
// copied to its DRAM at once (not pinned, not counted as a read), so the
// GET that follows is served from DRAM. Redis clients have no way to ask
// for it per call, so it is the door's setting (gd2fs server
// --resp-prefetch, gd2fs resp --prefetch):
//
//   - "off" (default): EXISTS only answers.
//   - "on": each key found is prefetched.
//   - "lmcache": also, for a key ending in "metadata", the key with
//     "kv_bytes" in its place: LMCache's RedisConnector checks EXISTS
//     <chunk>metadata and then reads <chunk>metadata and <chunk>kv_bytes,
//     and the second holds the KV bytes (docs/resp.md).

// PrefetchModes are the values of SetPrefetch.
var PrefetchModes = []string{"off", "on", "lmcache"}

// SetPrefetch sets what EXISTS prefetches; call it before Serve.
func (s *Server) SetPrefetch(mode string) error {
	switch mode {
	case "", "off":
		s.prefetch = 0
	case "on":
		s.prefetch = 1
	case "lmcache":
		s.prefetch = 2
	default:
		return errs.New(errs.ErrBadRequest, "prefetch %q: want one of %s", mode, strings.Join(PrefetchModes, ", "))
	}
	return nil
}

// maxPrefetches bounds the prefetch probes a door has in flight; past it a
// hit is not prefetched (its GET then comes from disk, as without).
const maxPrefetches = 256

// prefetchHit starts prefetching what an EXISTS hit of key calls for.
func (c *conn) prefetchHit(key []byte) {
	switch c.s.prefetch {
	case 0:
		return
	case 2:
		if bytes.HasSuffix(key, []byte("metadata")) {
			sib := append(bytes.TrimSuffix(append([]byte(nil), key...), []byte("metadata")), "kv_bytes"...)
			c.s.startPrefetch(sib)
		}
	}
	c.s.startPrefetch(append([]byte(nil), key...))
}

func (s *Server) startPrefetch(key []byte) {
	select {
	case s.prefetching <- struct{}{}:
	default:
		return
	}
	// Counted in s.wg, so Close waits for it before it releases the
	// backend's client; none starts once Close has begun.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.prefetching
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer func() { <-s.prefetching }()
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		defer cancel()
		if err := s.cfg.Backend.Prefetch(ctx, key); err != nil && !miss(err) {
			s.cfg.Log.Debug("resp: prefetch", "err", err)
		}
	}()
}

// Prefetch asks key's owner to copy it from its disk tier to DRAM (an
// exists probe with prefetch: client.ExistsOptions).
func (c *Cluster) Prefetch(ctx context.Context, key []byte) error {
	c.init()
	_, _, err := c.kv.BatchExistsWith(ctx, []string{string(key)}, client.ExistsOptions{Prefetch: true})
	return err
}

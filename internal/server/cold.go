package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/cold"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// Read-through for linked files (DESIGN.md §7): the server that owns a chunk
// fetches it from the cold tier once, however many clients ask at the same
// moment (a singleflight per chunk), stores and seals it, and serves every
// later read itself. N instances starting together cost one cold read.

type fill struct {
	done chan struct{}
	err  error
}

type filler struct {
	mu       sync.Mutex
	inflight map[uint64]*fill
}

// ensureChunk makes sure chunk ref.ID is in the store, filling it from the
// cold tier if needed. It reports whether this call waited for a fill.
//
// The store check is made under fills.mu, after looking for a fill in
// flight: a fill's store write makes the chunk visible (0 bytes long) before
// its bytes land, and a reader that took that for "here" read 0 bytes of it,
// which many readers arriving at once at a server just given a chunk (a
// refill after failure) made common. A chunk present with no fill in flight
// is served as it is: complete (a fill seals it), or written by a client (a
// pull in progress: its reader reads only what was committed).
func (s *Server) ensureChunk(ref wire.ColdRef) (bool, error) {
	s.fills.mu.Lock()
	f := s.fills.inflight[ref.ID]
	if f == nil {
		if _, err := s.store.Stat(ref.ID); err == nil {
			s.fills.mu.Unlock()
			return false, nil
		}
		if s.cold == nil {
			s.fills.mu.Unlock()
			return false, errs.New(errs.ErrUnavailable, "server %s has no S3 configuration for linked files: start it with --s3-endpoint (or AWS_ENDPOINT_URL) and credentials", s.cfg.ID)
		}
	}
	leader := f == nil
	if leader {
		f = &fill{done: make(chan struct{})}
		s.fills.inflight[ref.ID] = f
	}
	s.fills.mu.Unlock()
	if leader {
		f.err = s.fillChunk(ref)
		s.fills.mu.Lock()
		delete(s.fills.inflight, ref.ID)
		s.fills.mu.Unlock()
		close(f.done)
	} else {
		<-f.done
	}
	return true, f.err
}

// fillChunk fetches the chunk's bytes in parallel ranges, then stores and
// seals them. A chunk is either complete or absent: nothing is stored until
// every byte arrived.
func (s *Server) fillChunk(ref wire.ColdRef) error {
	if _, err := s.store.Stat(ref.ID); err == nil {
		return nil // written by a client meanwhile
	}
	bucket, key, err := cold.ParseURI(ref.URI)
	if err != nil {
		return err
	}
	bp := bufpool.Get(int(ref.Length))
	defer bufpool.Put(bp)
	buf := *bp
	ctx, cancel := context.WithTimeout(s.life, 10*time.Minute)
	defer cancel()
	const part = 4 << 20
	var wg sync.WaitGroup
	errc := make(chan error, (len(buf)+part-1)/part)
	for off := 0; off < len(buf); off += part {
		end := min(off+part, len(buf))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.cold.ReadRangeETag(ctx, bucket, key, ref.ETag, ref.Offset+int64(off), buf[off:end]); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		s.log.Warn("cold fill failed", "chunk", ref.ID, "source", ref.URI, "err", err)
		return err
	}
	s.metrics.coldBytes.Add(float64(len(buf)))
	s.coldBytes.Add(int64(len(buf)))
	if err := s.store.Write(ref.ID, 0, buf); err != nil {
		if errors.Is(err, errs.ErrSealed) {
			return nil // someone stored it meanwhile
		}
		return err
	}
	return s.store.Seal(ref.ID)
}

// readCold serves an OpReadCold: fill if needed, then read as OpRead.
func (s *Server) readCold(dc *dataConn, h wire.Header, ref wire.ColdRef, start time.Time) error {
	filled, err := s.ensureChunk(ref)
	if err != nil {
		return err
	}
	var flags uint16
	if filled {
		flags = wire.FlagColdFilled
	}
	return s.readWithFlags(dc, h, ref.ID, start, flags)
}

// newCold builds the cold source from the server's configuration (nil when none).
func newCold(cfg *cold.Config) (*cold.Source, error) {
	if cfg == nil {
		return nil, nil
	}
	return cold.New(*cfg)
}

package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/store"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// durable is the acknowledgement rule (docs/architecture.md, "Durability"):
// by default a write to a replicated chunk (the primary got a forward list)
// and a write flagged wire.FlagSync (a primary's forward) are on disk before
// they are acknowledged; a write to a chunk of one replica is in the page
// cache. --sync always / never change that for this server.
func (s *Server) durable(ref wire.ChunkRef, flags uint16) bool {
	switch s.cfg.Store.Sync {
	case store.SyncAlways:
		return true
	case store.SyncNever:
		return false
	}
	return len(ref.Forward) > 0 || flags&wire.FlagSync != 0
}

// forwardFlags are the flags of a write a primary forwards: FlagSync unless
// this server syncs nothing (then the cluster is run that way).
func (s *Server) forwardFlags() uint16 {
	if s.cfg.Store.Sync == store.SyncNever {
		return 0
	}
	return wire.FlagSync
}

// write stores locally and forwards to the other replicas in parallel; it
// succeeds only when every copy succeeded (DESIGN.md §8) and, for a
// replicated chunk, is on every replica's disk.
func (s *Server) write(ref wire.ChunkRef, off int64, p []byte, crc uint32, flags uint16) error {
	if len(ref.Forward) == 0 {
		err := s.store.WriteChecked(ref.ID, off, p, crc)
		if err == nil && s.durable(ref, flags) {
			err = s.store.Sync(ref.ID)
		}
		return err
	}
	errc := make(chan error, len(ref.Forward))
	d := s.forwardTimeout(len(p))
	ctx, cancel := context.WithTimeout(s.life, d)
	defer cancel()
	for _, addr := range ref.Forward {
		go func() {
			if err := s.peers.ForwardChunkV(ctx, addr, ref.ID, off, [][]byte{p}, crc, s.forwardFlags()); err != nil {
				errc <- forwardErr(ctx, addr, d, err)
				return
			}
			errc <- nil
		}()
	}
	err := s.store.WriteChecked(ref.ID, off, p, crc)
	if err == nil && s.durable(ref, flags) {
		err = s.store.Sync(ref.ID) // while the replicas sync theirs
	}
	for range ref.Forward {
		if e := <-errc; e != nil && err == nil {
			err = e
		}
	}
	return err
}

// writeDirect completes a write received straight into DRAM pages: it
// forwards the same pages to the other replicas while committing locally.
func (s *Server) writeDirect(ref wire.ChunkRef, off int64, pw *store.Pending, crc uint32, flags uint16) error {
	durable := s.durable(ref, flags)
	// Past the page cache, synced or not: the bytes are in DRAM already,
	// and the page-cache copy was a third of a perf write's CPU (issue 26,
	// docs/benchmarks.md); write-back would write them to disk anyway.
	pw.Uncached()
	if len(ref.Forward) == 0 {
		err := pw.Commit(crc)
		if err == nil && durable {
			err = s.store.Sync(ref.ID)
		}
		return err
	}
	errc := make(chan error, len(ref.Forward))
	n := 0
	for _, b := range pw.Bytes() {
		n += len(b)
	}
	d := s.forwardTimeout(n)
	ctx, cancel := context.WithTimeout(s.life, d)
	defer cancel()
	// Forwards and the local commit run together; the pages stay pinned
	// and the chunk locked until the forwards are done (CommitWhen waits).
	var wg sync.WaitGroup
	for _, addr := range ref.Forward {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.peers.ForwardChunkV(ctx, addr, ref.ID, off, pw.Bytes(), crc, s.forwardFlags()); err != nil {
				errc <- forwardErr(ctx, addr, d, err)
			}
		}()
	}
	// The local fdatasync runs while the replicas write and sync theirs
	// (Sync does not need the chunk lock CommitWhen holds meanwhile).
	var serr error
	err := pw.CommitWhen(crc, func() {
		if durable {
			serr = s.store.Sync(ref.ID)
		}
		wg.Wait()
	})
	close(errc)
	if err == nil {
		err = serr
	}
	if err == nil {
		err = <-errc
	}
	return err
}

// DefaultForwardTimeout is Config.ForwardTimeout's default.
const DefaultForwardTimeout = 8 * time.Second

// forwardTimeout is the deadline of forwarding n bytes to a replica.
func (s *Server) forwardTimeout(n int) time.Duration {
	return s.cfg.ForwardTimeout + time.Duration(n)*time.Second/(8<<20)
}

// forwardErr names the replica a forward failed on; a missed deadline is
// errs.ErrUnavailable, which clients treat as retryable.
func forwardErr(ctx context.Context, addr string, d time.Duration, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errs.New(errs.ErrUnavailable, "replica %s did not answer within %s (stopped, overloaded or cut off); the write is not complete: retry it: %w", addr, d.Round(time.Millisecond), err)
	}
	return fmt.Errorf("replica %s: %w", addr, err)
}

func (s *Server) read(dc *dataConn, h wire.Header, id uint64, start time.Time) error {
	return s.readWithFlags(dc, h, id, start, 0)
}

func (s *Server) readWithFlags(dc *dataConn, h wire.Header, id uint64, start time.Time, flags uint16) error {
	if h.Count > uint64(limits.MaxPayload) {
		return errs.New(errs.ErrTooLarge, "read of %d bytes beyond the %d-byte frame limit: split it", h.Count, limits.MaxPayload)
	}
	if h.Offset > limits.MaxChunk {
		return errs.New(errs.ErrOutOfRange, "read offset %d beyond any chunk", h.Offset)
	}
	sent := false
	err := s.store.Read(id, int64(h.Offset), int64(h.Count), func(bufs [][]byte, crc uint32) error {
		sent = true
		s.metrics.bytesOut.Add(float64(h.Count))
		s.servedBytes.Add(int64(h.Count))
		return dc.sendCRC(h, wire.StatusOK, bufs, flags, crc)
	})
	if !sent {
		return err
	}
	s.metrics.observe(h.Op, start, err)
	return errAnswered
}

// stat answers a chunk's length (Offset) and whether it is sealed.
func (s *Server) stat(dc *dataConn, h wire.Header, id uint64, start time.Time) error {
	info, err := s.store.Stat(id)
	if err != nil {
		return err
	}
	var flags uint16
	if info.Sealed {
		flags = wire.FlagSealed
	}
	out := h
	out.Offset = uint64(info.Length)
	if h.Flags&wire.FlagPrefetch != 0 {
		s.chunkPrefetch(id) // started before the answer: a caller that has it knows the copy is under way
	}
	dc.send(out, wire.StatusOK, nil, flags)
	s.metrics.observe(h.Op, start, nil)
	return errAnswered
}

// copyFrom fetches chunk id from server src: used by the master to restore
// the replica count of HA chunks after a server is lost.
func (s *Server) copyFrom(id uint64, src string) error {
	ctx, cancel := context.WithTimeout(s.life, 5*time.Minute)
	defer cancel()
	// Until the master records this copy (after it returns), the chunk is
	// one no file places here: reconcile must not report it, nor a
	// tombstone delete it (heartbeat.go).
	s.copyBegin(id)
	defer s.copyEnd(id)
	length, sealed, err := s.peers.StatChunk(ctx, src, id)
	if err != nil {
		return fmt.Errorf("copy chunk %d from %s: %w", id, src, err)
	}
	if _, err := s.store.Stat(id); err == nil {
		if err := s.store.Delete(id); err != nil {
			return err
		}
	}
	if err := s.copyExtents(ctx, id, src, length); err != nil { // extents.go
		return err
	}
	// A copy made to restore the replica count is as durable as the
	// replicas it joins, before the master records it as one.
	if s.cfg.Store.Sync != store.SyncNever {
		if err := s.store.Sync(id); err != nil {
			return err
		}
	}
	if sealed {
		return s.store.Seal(id)
	}
	return nil
}

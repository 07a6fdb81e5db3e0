package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/bufpool"
	"github.com/gd2fs/gd2fs/internal/limits"
	"github.com/gd2fs/gd2fs/internal/wire"
)

// extents answers which bytes of [Offset, Offset+Count) of a chunk some write
// covered (OpExtents), with the chunk's length and seal: the servers' word
// on what was written, which the master asks before it records a session
// range or a grown file (docs/kv-cache.md, "What the master checks").
func (s *Server) extents(dc *dataConn, h wire.Header, id uint64, start time.Time) error {
	if h.Offset > limits.MaxChunk || h.Count > limits.MaxChunk {
		return errs.New(errs.ErrOutOfRange, "extents of [%d, +%d): beyond any chunk", h.Offset, h.Count)
	}
	ext, length, sealed, err := s.store.Extents(id, int64(h.Offset), int64(h.Count))
	if err != nil {
		return err
	}
	var flags uint16
	if sealed {
		flags = wire.FlagSealed
	}
	out := h
	out.Offset = uint64(length)
	dc.send(out, wire.StatusOK, [][]byte{wire.AppendExtents(nil, ext)}, flags)
	s.metrics.observe(h.Op, start, nil)
	return errAnswered
}

// copyExtents copies the written bytes of chunk id, length bytes long, from
// server src: extent by extent, so the copy claims exactly what the source
// does (a hole stays a hole, never bytes a commit could claim). A source
// that does not speak OpExtents (an older server) is copied whole, as
// before.
func (s *Server) copyExtents(ctx context.Context, id uint64, src string, length int64) error {
	ext, _, _, err := s.peers.ChunkExtents(ctx, src, id, 0, length)
	if errors.Is(err, errs.ErrUnknownOp) {
		ext, err = []int64{0, length}, nil
	}
	if err != nil {
		return fmt.Errorf("copy chunk %d from %s: %w", id, src, err)
	}
	const piece = 4 << 20
	bp := bufpool.Get(piece)
	defer bufpool.Put(bp)
	for k := 0; k < len(ext); k += 2 {
		for off := ext[k]; off < ext[k+1]; off += piece {
			n := min(piece, ext[k+1]-off)
			if err := s.peers.ReadChunk(ctx, src, id, off, (*bp)[:n]); err != nil {
				return fmt.Errorf("copy chunk %d from %s: %w", id, src, err)
			}
			if err := s.store.Write(id, off, (*bp)[:n]); err != nil {
				return err
			}
		}
	}
	if length == 0 || len(ext) == 0 || ext[len(ext)-1] < length {
		// The copy is as long as its source even where the source ends in
		// a hole (an empty chunk; a record a crash damaged): an empty write
		// at the end sets the length and claims nothing.
		return s.store.Write(id, length, nil)
	}
	return nil
}

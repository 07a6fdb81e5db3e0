package store

import (
	"bytes"
	"testing"
	"time"
)

// A disk read's callback is the server's network write of the answer: it
// must run without the chunk's lock, so a slow client cannot hold up the
// chunk's other readers and writers (issue 21, bug 1).
func TestDiskReadCallbackRunsUnlocked(t *testing.T) {
	s := open(t, Config{Dir: t.TempDir(), DiskBytes: 64 << 20}) // disk only: every read is readDisk
	old := rnd(256<<10, 1)
	if err := s.Write(1, 0, old); err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	err := s.Read(1, 0, int64(len(old)), func(bufs [][]byte, crc uint32) error {
		// The "client" is stalled here; a writer of the same chunk must
		// still get through.
		go func() { wrote <- s.Write(1, 0, rnd(64<<10, 2)) }()
		select {
		case err := <-wrote:
			if err != nil {
				t.Errorf("write during a stalled read: %v", err)
			}
		case <-time.After(10 * time.Second): // a failure detector, not synchronisation
			t.Error("a write to the chunk waited for a stalled reader's callback: the read holds the chunk's lock")
			return nil
		}
		// The bytes handed to the callback are the reader's own: the write
		// that went through meanwhile must not show in them.
		if !bytes.Equal(bytes.Join(bufs, nil), old) {
			t.Error("a write changed the bytes a read was sending")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

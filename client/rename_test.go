package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/gd2fs/gd2fs/client"
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/cluster"
)

// TestRename: huggingface_hub's pattern (write <name>.incomplete, rename
// it over the final name) on a real cluster: the bytes move without a
// copy, a reader that opened the file before keeps reading it, a replaced
// file's chunks are freed, and what cannot be renamed says why.
func TestRename(t *testing.T) {
	c := start(t, cluster.Config{})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()

	old := rnd(3<<20+5, 7)
	writeFile(t, cl, "/m/model.bin", "ha", old)
	before, err := cl.Open(ctx, "/m/model.bin")
	if err != nil {
		t.Fatal(err)
	}
	data := rnd(5<<20+11, 8)
	writeFile(t, cl, "/m/model.bin.incomplete", "ha", data)
	st, err := cl.Stat(ctx, "/m/model.bin.incomplete")
	if err != nil {
		t.Fatal(err)
	}
	fi, err := cl.Rename(ctx, "/m/model.bin.incomplete", "/m/model.bin", client.RenameOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fi.Path != "/m/model.bin" || fi.Size != int64(len(data)) || !fi.Sealed || !fi.Modified.Equal(st.Modified) {
		t.Fatalf("rename answered %+v; the file was %+v", fi, st)
	}
	if got, err := readFile(t, cl, "/m/model.bin"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the new name reads other bytes (%v)", err)
	}
	if _, err := cl.Stat(ctx, "/m/model.bin.incomplete"); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("old name: %v, want not found", err)
	}
	// The same chunks, not a copy.
	if now, _ := cl.Stat(ctx, "/m/model.bin"); len(now.Chunks) != len(st.Chunks) || now.Chunks[0].ID != st.Chunks[0].ID {
		t.Fatalf("chunks changed in a rename: %+v vs %+v", now.Chunks, st.Chunks)
	}
	// The replaced file's reader may read until its chunks go (the servers'
	// next heartbeat, as for a remove), then fails: never the new bytes.
	buf := make([]byte, 1<<20)
	if _, err := before.ReadAt(buf, 0); err == nil && !bytes.Equal(buf, old[:1<<20]) {
		t.Fatal("a reader of the replaced file read other bytes")
	}
	if st, _ := cl.Status(ctx); st.Files != 1 || st.Bytes != int64(len(data)) {
		t.Fatalf("status after replacing: %d files, %d bytes", st.Files, st.Bytes)
	}

	// Refusals.
	writeFile(t, cl, "/m/other.bin", "perf", rnd(100, 9))
	if _, err := cl.Rename(ctx, "/m/other.bin", "/m/model.bin", client.RenameOptions{NoReplace: true}); !errors.Is(err, errs.ErrExists) {
		t.Fatalf("rename with NoReplace onto a file: %v", err)
	}
	w, err := cl.Create(ctx, "/m/writing.bin", client.CreateOptions{Pool: "perf"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Rename(ctx, "/m/writing.bin", "/m/w2.bin", client.RenameOptions{}); !errors.Is(err, errs.ErrBusy) {
		t.Fatalf("rename of a file being written: %v, want busy", err)
	}
	if _, err := cl.Rename(ctx, "/m", "/n", client.RenameOptions{}); !errors.Is(err, errs.ErrBusy) {
		t.Fatalf("rename of a folder with a file being written: %v, want busy", err)
	}
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// A folder, with everything in it.
	fi, err = cl.Rename(ctx, "/m", "/models/m", client.RenameOptions{})
	if err != nil || !fi.IsDir || fi.Path != "/models/m" {
		t.Fatalf("rename of a folder: %+v %v", fi, err)
	}
	if got, err := readFile(t, cl, "/models/m/model.bin"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("a file of the moved folder reads other bytes (%v)", err)
	}
	if es, err := cl.List(ctx, "/models/m"); err != nil || len(es) != 3 {
		t.Fatalf("moved folder lists %+v %v", es, err)
	}
	if _, err := cl.Rename(ctx, "/nope", "/x", client.RenameOptions{}); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("rename of nothing: %v", err)
	}
	if _, err := cl.Rename(ctx, "/models/m/model.bin", "/models/m/../x", client.RenameOptions{}); !errors.Is(err, errs.ErrBadRequest) {
		t.Fatalf("rename to a path with ..: %v", err)
	}
}

// TestReplacedWhileOpen: a reader whose every replica fails asks the
// master for the file's chunk map again, by name. When the name is another
// file's by then (renamed over it, as huggingface_hub's re-download does),
// that map would read the other file's bytes as this one's: the reader
// must fail instead.
func TestReplacedWhileOpen(t *testing.T) {
	c := start(t, cluster.Config{Servers: 3})
	cl := c.Client()
	defer cl.Close()
	ctx := context.Background()
	old := rnd(1<<20, 31)
	writeFile(t, cl, "/m/w.bin", "perf", old)
	st, err := cl.Stat(ctx, "/m/w.bin")
	if err != nil {
		t.Fatal(err)
	}
	victim := st.Chunks[0].Replicas[0].Server
	// A new version whose one chunk lives elsewhere (placement spreads
	// files over the servers).
	var next string
	newer := rnd(1<<20, 32)
	for i := 0; i < 20 && next == ""; i++ {
		p := fmt.Sprintf("/m/w.bin.incomplete%d", i)
		writeFile(t, cl, p, "perf", newer)
		if s, err := cl.Stat(ctx, p); err == nil && s.Chunks[0].Replicas[0].Server != victim {
			next = p
		}
	}
	if next == "" {
		t.Fatal("20 files all placed their chunk on one server")
	}
	r, err := cl.Open(ctx, "/m/w.bin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Rename(ctx, next, "/m/w.bin", client.RenameOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range c.Servers {
		if s.ID() == victim {
			s.Close()
		}
	}
	buf := make([]byte, 4096)
	_, err = r.ReadAt(buf, 0)
	if err == nil || bytes.Equal(buf, newer[:4096]) {
		t.Fatalf("a reader of the replaced file read %v (the new file's bytes: %v)", err, bytes.Equal(buf, newer[:4096]))
	}
}

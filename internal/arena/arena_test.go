package arena

import (
	"bytes"
	"testing"
)

func TestArena(t *testing.T) {
	a, err := New(10*4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Pages() != 10 || a.FreePages() != 10 {
		t.Fatalf("pages %d free %d", a.Pages(), a.FreePages())
	}
	ps, ok := a.Alloc(3)
	if !ok || a.FreePages() != 7 {
		t.Fatal("alloc 3")
	}
	if _, ok := a.Alloc(8); ok || a.FreePages() != 7 {
		t.Fatal("over-allocation must fail and change nothing")
	}
	data := bytes.Repeat([]byte("abcdefg"), 1500) // spans pages
	a.CopyIn(ps, 100, data)
	var got []byte
	for _, v := range a.Views(ps, 100, int64(len(data))) {
		got = append(got, v...)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("views do not read back what was copied in")
	}
	a.Zero(ps, 50, 4200)
	for _, v := range a.Views(ps, 50, 4150) {
		if !bytes.Equal(v, make([]byte, len(v))) {
			t.Fatal("zero left bytes")
		}
	}
	a.Release(ps)
	if a.FreePages() != 10 {
		t.Fatal("release")
	}
	if _, err := New(100, 4096); err == nil {
		t.Fatal("an arena smaller than a page was accepted")
	}
}

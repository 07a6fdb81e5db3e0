package arena

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
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

// TestReleaseKeepsPages: released pages stay resident for the next Alloc;
// none is handed to the kernel as lazily freeable (smaps' LazyFree), which
// made every reuse as costly as first touching fresh memory on a VM.
func TestReleaseKeepsPages(t *testing.T) {
	const size = 8 << 20
	a, err := New(size, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ps, ok := a.Alloc(a.Pages())
	if !ok {
		t.Fatal("alloc every page")
	}
	a.Zero(ps, 0, size) // touched: resident
	a.Release(ps)
	lazy, err := lazyFreeKiB(uintptr(unsafe.Pointer(&a.mem[0])))
	if err != nil {
		t.Skipf("no /proc/self/smaps here: %v", err)
	}
	if lazy != 0 {
		t.Fatalf("%d KiB of the arena were given to the kernel as lazily freeable on Release; reusing them costs what first touch does", lazy)
	}
	if a.FreePages() != a.Pages() {
		t.Fatalf("%d of %d pages free after releasing all", a.FreePages(), a.Pages())
	}
}

// lazyFreeKiB reads the LazyFree field of the mapping that starts at addr
// in /proc/self/smaps.
func lazyFreeKiB(addr uintptr) (int, error) {
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if lo, _, isRange := strings.Cut(f[0], "-"); isRange && !strings.HasSuffix(f[0], ":") {
			start, err := strconv.ParseUint(lo, 16, 64)
			in = err == nil && uintptr(start) == addr
			continue
		}
		if in && f[0] == "LazyFree:" && len(f) >= 2 {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("mapping at %#x has no LazyFree line", addr)
}

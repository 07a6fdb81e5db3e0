package arena

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
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
func lazyFreeKiB(addr uintptr) (int, error) { return smapsField(addr, "LazyFree:") }

// smapsField reads a numeric field of the mapping that starts at addr in
// /proc/self/smaps.
func smapsField(addr uintptr, field string) (int, error) {
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
		if in && f[0] == field && len(f) >= 2 {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("mapping at %#x has no %s line", addr, field)
}

// TestHugePages: where the kernel offers transparent huge pages, the
// arena's mapping may have them (advised MADV_HUGEPAGE): its first touch
// then faults once per 2 MiB, not once per 4 KiB.
func TestHugePages(t *testing.T) {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(b), "[never]") {
		t.Skipf("no transparent huge pages here (%q, %v)", b, err)
	}
	a, err := New(8<<20, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	eligible, err := smapsField(uintptr(unsafe.Pointer(&a.mem[0])), "THPeligible:")
	if err != nil {
		t.Skipf("no THPeligible in /proc/self/smaps here: %v", err)
	}
	if eligible != 1 {
		t.Fatalf("the arena's mapping may not have huge pages (THPeligible %d; THP %q)", eligible, strings.TrimSpace(string(b)))
	}
}

// resident counts the pages of a's mapping in memory (mincore).
func resident(t *testing.T, a *Arena) int {
	t.Helper()
	vec := make([]byte, (len(a.mem)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&a.mem[0])), uintptr(len(a.mem)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// Populate makes every page resident without changing a byte, also of
// pages written while it runs.
func TestPopulate(t *testing.T) {
	const size = 3*populateStep + 5*64<<10 // a part step at the end
	a, err := New(size, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	all := len(a.mem) / os.Getpagesize()
	if n := resident(t, a); n != 0 {
		t.Fatalf("%d of %d pages resident before any write", n, all)
	}
	ps, ok := a.Alloc(a.Pages())
	if !ok {
		t.Fatal("alloc every page")
	}
	fill := func(pg int, b byte) { a.CopyIn(ps[pg:pg+1], 100, bytes.Repeat([]byte{b}, 1000)) }
	fill(3, 'x') // before
	done := make(chan error, 1)
	go func() { done <- a.Populate(nil) }()
	for i := 0; i < a.Pages(); i += 7 { // while it runs
		fill(i, byte(i))
	}
	if err := <-done; err != nil {
		if errors.Is(err, unix.EINVAL) {
			t.Skipf("kernel without MADV_POPULATE_WRITE: %v", err)
		}
		t.Fatal(err)
	}
	if n := resident(t, a); n != all {
		t.Fatalf("%d of %d pages resident after Populate", n, all)
	}
	for i := 0; i < a.Pages(); i++ {
		want := byte(0)
		switch {
		case i%7 == 0:
			want = byte(i)
		case i == 3:
			want = 'x'
		}
		got := a.Page(ps[i])[100:1100]
		if !bytes.Equal(got, bytes.Repeat([]byte{want}, 1000)) {
			t.Fatalf("page %d changed by Populate: starts %q, want %q", i, got[:8], want)
		}
	}
}

// A closed stop ends Populate before its next step.
func TestPopulateStops(t *testing.T) {
	a, err := New(4*populateStep, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	stop := make(chan struct{})
	close(stop)
	if err := a.Populate(stop); err != nil {
		t.Fatal(err)
	}
	if n := resident(t, a); n != 0 {
		t.Fatalf("%d pages made resident after stop", n)
	}
}

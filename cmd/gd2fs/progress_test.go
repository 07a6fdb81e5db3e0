package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestProgressLines: off a sized terminal progress is lines — one per tenth
// crossed, and the final figure always — never cursor movements; with show
// false nothing at all.
func TestProgressLines(t *testing.T) {
	var b bytes.Buffer
	pb := newProgressOn(true, &b, false)
	const total = 1000
	for done := int64(0); done <= 990; done += 30 {
		pb.update("upload big.bin", done, total)
	}
	pb.update("upload big.bin", total, total)
	pb.wait()
	out := b.String()
	if strings.Contains(out, "\x1b") {
		t.Fatalf("escape sequences in the line form: %q", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 10 || len(lines) > 13 {
		t.Fatalf("%d lines, want one per tenth:\n%s", len(lines), out)
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "upload big.bin  1000 B / 1000 B  100%") {
		t.Fatalf("last line %q", last)
	}
	// A copy that stops short still shows where it stopped.
	b.Reset()
	pb = newProgressOn(true, &b, false)
	pb.update("f", 0, total)
	pb.update("f", 55, total)
	pb.wait()
	if !strings.Contains(b.String(), "f  55 B / 1000 B  5%") {
		t.Fatalf("the last figure of a short copy is missing:\n%s", b.String())
	}
	b.Reset()
	pb = newProgressOn(false, &b, false)
	pb.update("f", 1, 2)
	pb.wait()
	if b.Len() != 0 {
		t.Fatalf("progress shown when off: %q", b.String())
	}
}

package nspath

import (
	"errors"
	"strings"
	"testing"

	"github.com/gd2fs/gd2fs/errs"
)

func TestClean(t *testing.T) {
	for in, want := range map[string]string{"a/b": "/a/b", "/a//b/": "/a/b", "/": "/", "": "/"} {
		if got, err := Clean(in); err != nil || got != want {
			t.Errorf("Clean(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"/a/../b", "/./a", "/a\x00b", "/" + strings.Repeat("x", 4096)} {
		if _, err := Clean(in); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("Clean(%.20q) = %v, want ErrBadRequest", in, err)
		}
	}
}

// TestCleanNames: names that print as something else are refused.
func TestCleanNames(t *testing.T) {
	for _, p := range []string{"/a\nb", "/a\xffb", "/esc\x1b[2J", "/tab\there", "/del\x7f", "/c1\u0085"} {
		if _, err := Clean(p); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("Clean(%q) = %v, want a bad request", p, err)
		}
	}
	for _, p := range []string{"/models/m/w.bin", "/日本語/モデル", "/a b/c-d_e.f"} {
		if _, err := Clean(p); err != nil {
			t.Errorf("Clean(%q): %v", p, err)
		}
	}
}

// TestCheckName: the one rule for session ids, model names and server ids.
func TestCheckName(t *testing.T) {
	for _, s := range []string{"", ".", "..", "a/b", "a\x00b", "a\xffb", "a\nb", "\x1b[2J", strings.Repeat("x", MaxName+1)} {
		if err := CheckName("session id", s); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("CheckName(%q) = %v, want a bad request", s, err)
		}
	}
	for _, s := range []string{"chat-42", "alice:S", "llama-3-8b", "日本語", "a.b", "...", strings.Repeat("x", MaxName)} {
		if err := CheckName("session id", s); err != nil {
			t.Errorf("CheckName(%q): %v", s, err)
		}
	}
	for _, s := range []string{"a\x00", "\xff"} {
		if err := CheckText("attr", s); !errors.Is(err, errs.ErrBadRequest) {
			t.Errorf("CheckText(%q) = %v", s, err)
		}
	}
	if err := CheckText("attr", "two\nlines"); err != nil {
		t.Error(err)
	}
}

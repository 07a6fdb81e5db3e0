// Package nspath validates and normalises paths of the gd2fs namespace. It is
// a leaf, shared by the master, its metadata store and the client SDK, so the
// SDK need not link the metadata engine to check a path.
package nspath

import (
	"path"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/gd2fs/gd2fs/errs"
)

// Clean validates and normalises a namespace path: absolute, no empty,
// "." or ".." segments, no NUL, at most 4096 bytes, valid UTF-8 without
// control characters.
func Clean(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	if len(p) > 4096 || strings.ContainsRune(p, 0) {
		return "", errs.New(errs.ErrBadRequest, "path %.64q: too long or contains NUL", p)
	}
	if err := checkName(p); err != nil {
		return "", err
	}
	for _, seg := range strings.Split(strings.Trim(p, "/"), "/") {
		if seg == "." || seg == ".." {
			return "", errs.New(errs.ErrBadRequest, "path %q: '.' and '..' are not allowed", p)
		}
	}
	return path.Clean(p), nil
}

// checkName refuses path names that are not valid UTF-8 or hold control
// characters: they print as something else than they are (a newline splits a
// listing line, a terminal escape rewrites the screen) and cannot be typed
// back. Checked on every path that reaches the master (Clean).
func checkName(p string) error {
	if !utf8.ValidString(p) {
		return errs.New(errs.ErrBadRequest, "name %+q is not valid UTF-8", p)
	}
	for _, r := range p {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return errs.New(errs.ErrBadRequest, "name %+q holds a control character (U+%04X): names must be printable", p, r)
		}
	}
	return nil
}

// MaxName is the longest name CheckName accepts, in bytes.
const MaxName = 256

// CheckName is the one rule for the names that are not paths but become
// part of one or are printed as one: session ids, model names, pool names,
// server ids. A name is 1 … MaxName bytes of valid UTF-8 without control
// characters (NUL included), holds no '/', and is not "." or "..": so it is
// one path segment that prints as itself, can be typed back, and is stored
// the same by SQLite and PostgreSQL (which refuses NUL and invalid UTF-8 in
// text). kind names the field in the error ("session id").
func CheckName(kind, s string) error {
	if s == "" || len(s) > MaxName {
		return errs.New(errs.ErrBadRequest, "%s %.64q: want 1 to %d bytes", kind, s, MaxName)
	}
	if s == "." || s == ".." || strings.ContainsRune(s, '/') {
		return errs.New(errs.ErrBadRequest, "%s %q: '/', '.' and '..' are not allowed (a name is one path segment)", kind, s)
	}
	if err := checkName(s); err != nil {
		return errs.New(errs.ErrBadRequest, "%s: %w", kind, err)
	}
	return nil
}

// CheckText is the rule for free text stored as SQL text (attribute keys
// and values, request ids): valid UTF-8 without NUL, which PostgreSQL
// refuses in text and SQLite would keep; so both engines give the same
// answer. Other control characters are allowed (an attribute value may hold
// a newline).
func CheckText(kind, s string) error {
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return errs.New(errs.ErrBadRequest, "%s %+.64q: want valid UTF-8 without NUL", kind, s)
	}
	return nil
}

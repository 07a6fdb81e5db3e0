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
		return errs.New(errs.ErrBadRequest, "path %+q is not valid UTF-8", p)
	}
	for _, r := range p {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return errs.New(errs.ErrBadRequest, "path %+q holds a control character (U+%04X): names must be printable", p, r)
		}
	}
	return nil
}

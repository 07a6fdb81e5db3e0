package meta

import (
	"github.com/gd2fs/gd2fs/errs"
	"github.com/gd2fs/gd2fs/internal/nspath"
)

// Names and text, checked before any SQL (issue 22 findings 9 and 10).
//
// PostgreSQL refuses NUL and invalid UTF-8 in text columns with an error
// that looked like an outage (503); SQLite stores them. So every string a
// store method takes is checked first, and both engines answer the same:
// a bad request. Names a store creates (session ids, model names, server
// ids) follow nspath.CheckName, the one rule for names: printable UTF-8,
// no '/', not "." or ".." (so "/kv-sessions/../kv-1" cannot be made).
// Names a store only looks up or deletes are held to the text rule, so an
// odd name stored before the rule existed can still be removed.

// checkSessionID is the rule for a new session id.
func checkSessionID(id string) error { return nspath.CheckName("session id", id) }

// checkModelName is the rule for a model a layout or plan names.
func checkModelName(m string) error { return nspath.CheckName("model name", m) }

// checkText refuses NUL and invalid UTF-8 in any of ss.
func checkText(kind string, ss ...string) error {
	for _, s := range ss {
		if err := nspath.CheckText(kind, s); err != nil {
			return err
		}
	}
	return nil
}

// checkAttrs: attribute keys are names of a sort (non-empty text), values
// any text.
func checkAttrs(attrs map[string]string) error {
	for k, v := range attrs {
		if k == "" {
			return errs.New(errs.ErrBadRequest, "an attribute needs a name")
		}
		if err := checkText("attribute", k, v); err != nil {
			return err
		}
	}
	return nil
}

// checkServer is the rule for a server's record.
func checkServer(sv Server) error {
	if err := nspath.CheckName("server id", sv.ID); err != nil {
		return err
	}
	return checkText("server address", sv.Addr)
}

package router

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gd2fs/gd2fs/internal/fastjson"
	"github.com/gd2fs/gd2fs/internal/nspath"
)

// Who may use whose session (docs/kv-cache.md, "The router's tenants").
//
// A session id a client sends is only a name: client B naming client A's
// session must not be served A's stored tokens, nor grow A's session with
// its own turn. So the router binds every session to a tenant, the caller
// it authenticated, and plans under "<tenant>:<session>": two tenants'
// sessions of the same name are two sessions. The tenant comes from, in
// this order:
//
//   - Keys (a keys file): the API key of the request's "Authorization:
//     Bearer" header names its tenant; a request with a key the file does
//     not hold is refused (401).
//   - TenantHeader: a header set by a proxy in front of the router that has
//     authenticated the caller (the router cannot tell a forged one, so the
//     proxy must overwrite it).
//   - KeyTenants: the API key itself (its SHA-256, never the key) is the
//     tenant, for an engine that checks keys itself.
//
// A request with no tenant has no session (it is forwarded without a plan)
// unless SharedSessions chooses one namespace shared by every caller, as a
// single-user deployment wants: then the client's session id is used as it
// is.

// tenantOK is the rule for a tenant name: it becomes the prefix of a
// session id up to the first ':', so it must not hold one.
func tenantOK(t string) bool {
	if t == "" || len(t) > 64 {
		return false
	}
	for _, c := range t {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// LoadKeys reads a keys file: one "API_KEY TENANT" pair a line; blank lines
// and lines starting with # are skipped. Several keys may name one tenant
// (a key rotated without losing the tenant's sessions).
func LoadKeys(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("router keys file: %w", err)
	}
	defer f.Close()
	keys := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) != 2 || !tenantOK(fs[1]) {
			return nil, fmt.Errorf("router keys file %s line %d: want \"API_KEY TENANT\", the tenant of letters, digits, '-', '_', '.' (at most 64)", path, n)
		}
		keys[fs[0]] = fs[1]
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("router keys file %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("router keys file %s holds no key", path)
	}
	return keys, nil
}

// errNoKey is the answer to a request whose key the keys file lacks.
type errNoKey struct{}

func (errNoKey) Error() string {
	return "gd2fs router: unknown or missing API key: send \"Authorization: Bearer KEY\" with a key of the router's keys file"
}

// bearer is the request's API key, "" without one.
func bearer(req *http.Request) string {
	k, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(k)
}

// tenant is the request's tenant: "" for none (and shared is true when the
// router runs one shared namespace), an errNoKey when a keys file refuses
// the request.
func (r *Router) tenant(req *http.Request) (string, error) {
	switch {
	case r.cfg.Keys != nil:
		t, ok := r.cfg.Keys[bearer(req)]
		if !ok {
			return "", errNoKey{}
		}
		return t, nil
	case r.cfg.TenantHeader != "":
		t := req.Header.Get(r.cfg.TenantHeader)
		if t != "" && !tenantOK(t) {
			return "", fmt.Errorf("gd2fs router: %s %.64q: a tenant is letters, digits, '-', '_', '.' (at most 64)", r.cfg.TenantHeader, t)
		}
		return t, nil
	case r.cfg.KeyTenants:
		if k := bearer(req); k != "" {
			sum := sha256.Sum256([]byte(k))
			return "k" + hex.EncodeToString(sum[:12]), nil
		}
	}
	return "", nil
}

// sessionID is the store's id of the request's session: the client's id
// (its header, else the body's "user") in the caller's tenant, and in the
// request's model when that is not the router's. ok is false
// when the request has no session: none named, or no tenant and no shared
// namespace. A name the store could not hold is an error (400).
func (r *Router) sessionID(req *http.Request, doc map[string]json.RawMessage) (id string, ok bool, err error) {
	tenant, err := r.tenant(req)
	if err != nil {
		return "", false, err
	}
	s := req.Header.Get(r.cfg.SessionHeader)
	if s == "" {
		if u, has := doc["user"]; has {
			json.Unmarshal(u, &s)
		}
	}
	if s == "" {
		return "", false, nil
	}
	switch {
	case tenant != "":
		s = tenant + ":" + s
	case !r.cfg.SharedSessions:
		r.m.untenanted.Inc()
		return "", false, nil
	}
	// A request for another model than the router's (a LoRA adapter the
	// engine serves under its own name, an alias) gets a session of its
	// own: KV computed under one model is not another's for the same token
	// ids, so a chat that switches models must not be served the other's
	// KV as a hit. The name is hashed: served names hold '/'.
	if err := nspath.CheckName("session id", s); err != nil {
		return "", false, err
	}
	var model string
	if raw, has := doc["model"]; has && json.Unmarshal(raw, &model) == nil && model != "" && model != r.cfg.Model {
		sum := sha256.Sum256([]byte(model))
		if s += "@" + hex.EncodeToString(sum[:6]); len(s) > nspath.MaxName {
			return "", false, nil // no room for the model: the request goes on without cache
		}
	}
	return s, true, nil
}

// stripTransferParams removes a client's own kv_transfer_params from a
// request body: only the router's plan may tell the engine which stored
// bytes to load and where to save (a client's own would name any file,
// another session's included). A body that is a JSON object loses the key
// (whatever its spelling: the decoder unescapes keys, and of duplicated keys
// keeps one), whatever its Content-Type; a form upload (multipart or
// urlencoded) that is not JSON is passed on as it is; anything else is
// refused, since the engine's JSON parser might read a body the router's
// cannot (NaN, say) and find params in it. doc is nil for a body that is
// not JSON.
func stripTransferParams(contentType string, body []byte) (out []byte, doc map[string]json.RawMessage, err error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return body, nil, nil
	}
	// JSON first, whatever the type says: clients (Python's urllib) send
	// JSON bodies as application/x-www-form-urlencoded. fastjson.Members
	// reads a body as encoding/json does, five times faster (a prompt of
	// token ids); what it does not take, encoding/json reads or refuses.
	doc, ok := fastjson.Members(body)
	if !ok {
		doc = nil
		if jerr := json.Unmarshal(body, &doc); jerr != nil || doc == nil {
			if mt, _, _ := mime.ParseMediaType(contentType); mt == "multipart/form-data" || mt == "application/x-www-form-urlencoded" {
				return body, nil, nil // a form upload
			}
			return nil, nil, fmt.Errorf("gd2fs router: the request body is not a JSON object (%v): send one", jerr)
		}
	}
	if _, ok := doc["kv_transfer_params"]; !ok {
		return body, doc, nil
	}
	delete(doc, "kv_transfer_params")
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("gd2fs router: re-encoding the request: %w", err)
	}
	return b, doc, nil
}

// readBody reads a request's body within MaxBody and BodyTimeout, then
// lifts the read deadline (a stream's answer may take long; the deadline
// must not cancel it).
func (r *Router) readBody(w http.ResponseWriter, req *http.Request) ([]byte, error) {
	rc := http.NewResponseController(w)
	if r.cfg.BodyTimeout > 0 {
		rc.SetReadDeadline(time.Now().Add(r.cfg.BodyTimeout))
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBody))
	if err != nil {
		// The deadline stays: what is left of the body is not waited for.
		w.Header().Set("Connection", "close")
		return nil, err
	}
	rc.SetReadDeadline(time.Time{})
	return b, nil
}

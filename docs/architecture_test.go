// Package docs holds no code: its test keeps docs/architecture.md's package
// map true to the code (every package listed, each row's imports column
// what the package really imports).
package docs

import (
	"bufio"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gd2fs/gd2fs"

// TestPackageMap checks the table under "## Packages": one row per package of
// the module (test-only packages aside), and in each row's imports column
// exactly the module's packages it imports directly (by last path element;
// "—" for none; a column ending in "…" lists a subset).
func TestPackageMap(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{} // package (relative) → gd2fs imports, by short name
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		rel := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		if rel == "docs" {
			continue
		}
		var own []string
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module+"/") {
				own = append(own, short(strings.TrimPrefix(imp, module+"/")))
			}
		}
		slices.Sort(own)
		imports[rel] = slices.Compact(own)
	}

	doc, err := os.Open("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	defer doc.Close()
	rows := map[string]string{}
	in := false
	sc := bufio.NewScanner(doc)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Packages"
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			t.Errorf("architecture.md: a package row without an imports column: %s", line)
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[0]), "`")
		rows[name] = strings.TrimSpace(cells[len(cells)-1])
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	for pkg, want := range imports {
		col, ok := rows[pkg]
		if !ok {
			t.Errorf("architecture.md lists no package %s (imports: %s): add its row to the package map", pkg, strings.Join(want, ", "))
			continue
		}
		listed, subset := parseColumn(col)
		for _, name := range listed {
			if !slices.Contains(want, name) {
				t.Errorf("architecture.md: %s does not import %s, but its row says so (it imports: %s)", pkg, name, orNone(want))
			}
		}
		if !subset {
			for _, name := range want {
				if !slices.Contains(listed, name) {
					t.Errorf("architecture.md: %s imports %s, which its row leaves out", pkg, name)
				}
			}
		}
	}
	for pkg := range rows {
		if _, ok := imports[pkg]; !ok {
			t.Errorf("architecture.md lists %s, which is not a package of the module", pkg)
		}
	}
}

// short names a package in the imports column: its last path element, or
// the last two for a nested helper such as meta/metatest.
func short(rel string) string {
	if rel == "internal/meta/metatest" {
		return "metatest"
	}
	return path.Base(rel)
}

func parseColumn(col string) (names []string, subset bool) {
	if col == "—" || col == "" {
		return nil, false
	}
	for _, f := range strings.Split(col, ",") {
		f = strings.Trim(strings.TrimSpace(f), "`")
		if f == "…" {
			subset = true
			continue
		}
		names = append(names, f)
	}
	return names, subset
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// TestLayering: the facts every layer shares come from internal/limits and
// internal/crc32c, so no layer imports another only for them (issue 21): the
// tiers speak no wire protocol, the master links no tier, and the SDK links
// no part of a server.
func TestLayering(t *testing.T) {
	never := map[string][]string{
		"internal/store":   {"internal/wire", "internal/tcp", "internal/server"},
		"internal/kvstore": {"internal/wire", "internal/tcp", "internal/server"},
		"internal/master":  {"internal/store", "internal/kvstore", "internal/server"},
		"client":           {"internal/store", "internal/kvstore", "internal/server"},
	}
	for pkg, bad := range never {
		out, err := exec.Command("go", "list", "-deps", module+"/"+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		for _, b := range bad {
			if slices.Contains(deps, module+"/"+b) {
				t.Errorf("%s links %s", pkg, b)
			}
		}
	}
}

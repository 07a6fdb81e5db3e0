// Package docs holds no code: its test keeps docs/architecture.md's package
// map true to the code (every package listed, each row's imports column
// what the package really imports).
package docs

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
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

// TestPathOfAByte: every function the section "The path of a byte" names
// exists where it says: `pkg.Type.Method`, `pkg.Func` or `pkg.Method`,
// `Type.Method`, and the plain lower-case names of functions and methods.
func TestPathOfAByte(t *testing.T) {
	b, err := os.ReadFile("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "## The path of a byte")
	if i < 0 {
		t.Fatal(`architecture.md has no section "The path of a byte"`)
	}
	sec := s[i:]
	if j := strings.Index(sec[3:], "\n## "); j >= 0 {
		sec = sec[:j+3]
	}
	// funcs: package directory → "Type.Method" and "Func" defined there.
	funcs := map[string]map[string]bool{}
	fset := token.NewFileSet()
	err = filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := filepath.Base(filepath.Dir(p))
		if funcs[dir] == nil {
			funcs[dir] = map[string]bool{}
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) == 1 {
				rt := fd.Recv.List[0].Type
				if st, ok := rt.(*ast.StarExpr); ok {
					rt = st.X
				}
				if id, ok := rt.(*ast.Ident); ok {
					name = id.Name + "." + name
				}
			}
			funcs[dir][name] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// has reports whether some package (pkg "" = any) defines the function
	// or method name (a method matches by its own name or as Type.Method).
	has := func(pkg, name string) bool {
		for dir, fs := range funcs {
			if pkg != "" && dir != pkg {
				continue
			}
			for f := range fs {
				if f == name || strings.HasSuffix(f, "."+name) {
					return true
				}
			}
		}
		return false
	}
	notGo := map[string]bool{"bad_request": true, "checksum": true, "out_of_range": true, "pread": true, "writev": true}
	named := regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)*)`")
	checked := 0
	for _, m := range named.FindAllStringSubmatch(sec, -1) {
		parts := strings.Split(m[1], ".")
		ok := true
		switch {
		case len(parts) == 3:
			ok = has(parts[0], parts[1]+"."+parts[2])
		case len(parts) == 2 && funcs[parts[0]] != nil:
			ok = has(parts[0], parts[1])
		case len(parts) == 2:
			ok = has("", parts[0]+"."+parts[1])
		case notGo[parts[0]] || unicode.IsUpper(rune(parts[0][0])):
			continue // a status, a system call, or a type, field or constant
		default:
			ok = has("", parts[0])
		}
		checked++
		if !ok {
			t.Errorf("architecture.md, the path of a byte, names %s, which the code does not define (rename it there)", m[1])
		}
	}
	if checked < 10 {
		t.Fatalf("only %d names checked in the path of a byte: has the section changed shape?", checked)
	}
}

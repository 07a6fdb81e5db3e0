package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gd2fs/gd2fs/errs"
)

// Rename of files and directories (issue 24): huggingface_hub writes
// <name>.incomplete and renames it, and `mv` inside a model folder is
// ordinary use. Rename is one transaction, so a reader sees the old name
// or the new one, never neither, never a half-moved folder.
//
// The rules, and why:
//
//   - A file that is not sealed is refused (ErrBusy): its writer allocates
//     and commits by path, so after a rename it would fail, or, once
//     another file took the old name, write into that file.
//   - A file a KV session holds (a range, a session file, a registered
//     prefix) is refused (ErrBusy): sessions name their files by path.
//   - A sealed file replaces a sealed file at the new name, atomically, as
//     POSIX rename(2) does (huggingface_hub's re-download replaces the old
//     blob so), unless RenameOptions.NoReplace (ErrExists). The replaced
//     file's chunks are tombstoned as a remove's are.
//   - A directory moves with everything under it, onto a name that is free
//     or an empty directory (POSIX), not into itself (ErrBadRequest), and
//     only when nothing under it is being written or held by a session.
//   - The parents of the new name are created, as a create does (a gd2fs
//     folder exists while something is in it).
//   - A file keeps its id, chunks, size, modification time and attributes
//     (a linked file keeps its S3 source and etag, a model file its
//     sha256): only its name changes.

// RenameOptions tune Rename.
type RenameOptions struct {
	// NoReplace refuses a rename onto an existing name (ErrExists), as
	// renameat2's RENAME_NOREPLACE and `mv -n` do.
	NoReplace bool
	// RequestID, when set, is stored with a renamed file (RenameIDAttr) in
	// the same transaction, so a master that retries a rename whose answer
	// was lost recognises it as done.
	RequestID string
}

// RenameIDAttr is the attribute holding the RequestID of a file's last rename.
const RenameIDAttr = "rename_id"

func (s *sqlStore) Rename(ctx context.Context, from, to string, o RenameOptions, now time.Time) error {
	if err := checkText("path", from, to, o.RequestID); err != nil {
		return err
	}
	if from == "/" || to == "/" {
		return errs.New(errs.ErrBadRequest, "cannot rename the root directory, or onto it")
	}
	return s.lockedTx(ctx, func(tx *sql.Tx) error {
		f, err := s.fileBy(ctx, tx, "path", from)
		if err == nil {
			return s.renameFileTx(ctx, tx, f, to, o, now)
		}
		if !errors.Is(err, errs.ErrNotFound) {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM dirs WHERE path = ?`), from).Scan(&n); err != nil {
			return wrapDB(err)
		}
		if n == 0 {
			return errs.New(errs.ErrNotFound, "no file or directory %s to rename", from)
		}
		return s.renameDirTx(ctx, tx, from, to, o, now)
	})
}

// busyTx says why the file at p cannot change its name now ("" when it can).
func (s *sqlStore) busyTx(ctx context.Context, tx *sql.Tx, f File) (string, error) {
	if !f.Sealed {
		return f.Path + " is still being written (not sealed): rename it after its writer closes it, or remove it if its writer died", nil
	}
	by, err := s.inUseTx(ctx, tx, f.Path)
	if err != nil {
		return "", err
	}
	if by == "" {
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM kv_prefixes WHERE path = ?`), f.Path).Scan(&n); err != nil {
			return "", wrapDB(err)
		}
		if n > 0 {
			by = "a registered shared prefix"
		}
	} else {
		by = "KV session " + by
	}
	if by != "" {
		return f.Path + " is in use by " + by + ": KV files keep their names (delete the session first)", nil
	}
	return "", nil
}

func (s *sqlStore) renameFileTx(ctx context.Context, tx *sql.Tx, f File, to string, o RenameOptions, now time.Time) error {
	if why, err := s.busyTx(ctx, tx, f); err != nil {
		return err
	} else if why != "" {
		return errs.New(errs.ErrBusy, "%s", why)
	}
	if to == f.Path {
		return nil // POSIX: renaming a file onto itself does nothing
	}
	if strings.HasPrefix(to, f.Path+"/") {
		return errs.New(errs.ErrNotDir, "%s is a file, so it cannot hold %s", f.Path, to)
	}
	old, err := s.fileBy(ctx, tx, "path", to)
	switch {
	case err == nil:
		if o.NoReplace {
			return errs.New(errs.ErrExists, "%s already exists: remove it first, or rename with replace", to)
		}
		if why, err := s.busyTx(ctx, tx, old); err != nil {
			return err
		} else if why != "" {
			return errs.New(errs.ErrBusy, "cannot replace it: %s", why)
		}
		if err := s.removeFileTx(ctx, tx, to); err != nil {
			return err
		}
	case !errors.Is(err, errs.ErrNotFound):
		return err
	default:
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM dirs WHERE path = ?`), to).Scan(&n); err != nil {
			return wrapDB(err)
		}
		if n > 0 {
			return errs.New(errs.ErrIsDir, "%s is a directory: name the file inside it (%s/%s)", to, to, baseOf(f.Path))
		}
	}
	if err := s.ensureDirs(ctx, tx, to, false, now); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE files SET path = ?, parent = ? WHERE id = ?`), to, parentOf(to), f.ID); err != nil {
		return wrapDB(err)
	}
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE file_attrs SET path = ? WHERE path = ?`), to, f.Path); err != nil {
		return wrapDB(err)
	}
	if o.RequestID != "" {
		if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO file_attrs (path, name, value) VALUES (?, ?, ?)
			ON CONFLICT (path, name) DO UPDATE SET value = excluded.value`), to, RenameIDAttr, o.RequestID); err != nil {
			return wrapDB(err)
		}
	}
	return nil
}

func baseOf(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }

// under is the SQL condition "col is p or below it" (two arguments: the
// length of p/ in characters, p/), written with substr so that no
// character of a name is a pattern (LIKE would take '%' and '_').
func under(col string) string {
	return `substr(` + col + `, 1, CAST(? AS INTEGER)) = CAST(? AS TEXT)`
}

func (s *sqlStore) renameDirTx(ctx context.Context, tx *sql.Tx, from, to string, o RenameOptions, now time.Time) error {
	if to == from {
		return nil
	}
	if strings.HasPrefix(to, from+"/") {
		return errs.New(errs.ErrBadRequest, "cannot move directory %s into itself (%s)", from, to)
	}
	prefix := from + "/"
	np := utf8.RuneCountInString(prefix)
	// Nothing under from may be written or held by a session now.
	var unsealed int
	if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM files WHERE sealed = 0 AND `+under("path")), np, prefix).Scan(&unsealed); err != nil {
		return wrapDB(err)
	}
	if unsealed > 0 {
		return errs.New(errs.ErrBusy, "%d files under %s are still being written (not sealed): rename the directory after they are closed, or remove those whose writer died", unsealed, from)
	}
	var held int
	if err := tx.QueryRowContext(ctx, s.q(`SELECT
		(SELECT COUNT(*) FROM kv_ranges WHERE `+under("path")+`) +
		(SELECT COUNT(*) FROM kv_files WHERE `+under("path")+`) +
		(SELECT COUNT(*) FROM kv_prefixes WHERE `+under("path")+`)`), np, prefix, np, prefix, np, prefix).Scan(&held); err != nil {
		return wrapDB(err)
	}
	if held > 0 {
		return errs.New(errs.ErrBusy, "%s holds files of KV sessions or shared prefixes: KV files keep their names (delete the sessions first)", from)
	}
	// The new name: free, or an empty directory (POSIX), never a file.
	var isFile, isDir int
	if err := tx.QueryRowContext(ctx, s.q(`SELECT (SELECT COUNT(*) FROM files WHERE path = ?), (SELECT COUNT(*) FROM dirs WHERE path = ?)`), to, to).Scan(&isFile, &isDir); err != nil {
		return wrapDB(err)
	}
	if isFile > 0 {
		return errs.New(errs.ErrNotDir, "%s is a file: a directory cannot replace it", to)
	}
	if isDir > 0 {
		if o.NoReplace {
			return errs.New(errs.ErrExists, "%s already exists", to)
		}
		var n int
		if err := tx.QueryRowContext(ctx, s.q(`SELECT (SELECT COUNT(*) FROM dirs WHERE parent = ?) + (SELECT COUNT(*) FROM files WHERE parent = ?)`), to, to).Scan(&n); err != nil {
			return wrapDB(err)
		}
		if n > 0 {
			return errs.New(errs.ErrNotEmpty, "directory %s is not empty: move %s into it (%s/%s), or remove its entries first", to, from, to, baseOf(from))
		}
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM dirs WHERE path = ?`), to); err != nil {
			return wrapDB(err)
		}
	}
	if err := s.ensureDirs(ctx, tx, to, false, now); err != nil {
		return err
	}
	// Everything below from: its path, and its parent (from itself or
	// below), take to in place of from.
	move := `CAST(? AS TEXT) || substr(%[1]s, CAST(? AS INTEGER))`
	for _, q := range []string{
		`UPDATE files SET path = ` + fmt.Sprintf(move, "path") + `, parent = ` + fmt.Sprintf(move, "parent") + ` WHERE ` + under("path"),
		`UPDATE dirs SET path = ` + fmt.Sprintf(move, "path") + `, parent = ` + fmt.Sprintf(move, "parent") + ` WHERE ` + under("path"),
	} {
		if _, err := tx.ExecContext(ctx, s.q(q), to, np, to, np, np, prefix); err != nil {
			return wrapDB(err)
		}
	}
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE file_attrs SET path = `+fmt.Sprintf(move, "path")+` WHERE `+under("path")), to, np, np, prefix); err != nil {
		return wrapDB(err)
	}
	_, err := tx.ExecContext(ctx, s.q(`UPDATE dirs SET path = ?, parent = ? WHERE path = ?`), to, parentOf(to), from)
	return wrapDB(err)
}

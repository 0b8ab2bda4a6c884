//! No import circles between the files of the workspace's crates: a file
//! that takes names from a second file, which (through others) takes names
//! from the first, is two stages that cannot be understood, tested or
//! replaced apart. Modules may compose their own children (`mod x;`,
//! `pub use x::Y`): a module's edges to files inside it are its structure,
//! not a dependency. Every other `use` and inline `crate::`/`super::` path
//! is an edge to the file that defines the name, through re-exports; and
//! between two modules of one parent when files inside them are tied.
//! Test code (`#[cfg(test)]` modules) is left out: tests sit above what
//! they test.
//!
//! No crate does this for Rust (cargo-modules needs rust-analyzer, minutes
//! of build); this reads the sources as text: names are resolved through
//! module files and `pub use`, which is how this workspace writes them.

mod graph;
mod modules;
mod source;

use std::path::{Path, PathBuf};

use modules::Crate;
use source::{expand, tokenize};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace above profiler-daemon/")
        .to_path_buf()
}

fn assert_no_circles(root: &Path) {
    let krate = Crate::read(root);
    assert!(krate.modules.len() > 1, "{} declares no modules", root.display());
    let circles = krate.circles();
    assert!(
        circles.is_empty(),
        "import circles in the crate of {}:\n{}",
        root.display(),
        circles.join("\n")
    );
}

#[test]
fn the_daemon_has_no_import_circle() {
    assert_no_circles(&workspace().join("profiler-daemon/src/lib.rs"));
}

#[test]
fn the_bpf_program_has_no_import_circle() {
    assert_no_circles(&workspace().join("profiler-ebpf/src/main.rs"));
}

#[test]
fn the_shared_types_have_no_import_circle() {
    let krate = Crate::read(&workspace().join("profiler-common/src/lib.rs"));
    assert!(krate.circles().is_empty(), "{:?}", krate.circles());
}

/// A small crate in a scratch directory: (relative path, contents).
fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("import-circles-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a scratch directory");
        std::fs::write(&path, text).expect("a scratch file");
    }
    dir
}

#[test]
fn a_circle_through_a_re_export_is_found_and_named() {
    let dir = scratch(
        "circle",
        &[
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a/mod.rs", "mod x;\npub use x::Thing;\n"),
            ("a/x.rs", "use crate::b::helper;\npub struct Thing;\n"),
            // Braces and paths in strings and comments count for nothing.
            (
                "b.rs",
                "// crate::nothing::here\npub fn helper() { let _ = \"}{\"; let _t: crate::a::Thing; }\n",
            ),
        ],
    );
    let circles = Crate::read(&dir.join("lib.rs")).circles();
    // Between the files, and between the modules that hold them.
    assert_eq!(circles.len(), 2, "{circles:?}");
    assert!(
        circles[0].contains("a/x.rs -> ") && circles[0].contains(": helper"),
        "{}",
        circles[0]
    );
    assert!(
        circles[0].contains("b.rs -> ") && circles[0].contains(": Thing"),
        "{}",
        circles[0]
    );
    assert!(
        circles[1].contains("module a -> module b: helper"),
        "{}",
        circles[1]
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_circle_between_modules_through_different_files_is_found() {
    // No file takes from a file that takes from it, but `profile` and
    // `store` each take from the other (as Window and Profile once did).
    let dir = scratch(
        "modules",
        &[
            ("lib.rs", "mod profile;\nmod store;\n"),
            ("profile/mod.rs", "mod render;\npub struct Profile;\n"),
            ("profile/render.rs", "use crate::store::Filter;\n"),
            (
                "store/mod.rs",
                "mod query;\npub use query::Filter;\nuse crate::profile::Profile;\n",
            ),
            ("store/query.rs", "pub struct Filter;\n"),
        ],
    );
    let circles = Crate::read(&dir.join("lib.rs")).circles();
    assert_eq!(circles.len(), 1, "{circles:?}");
    assert!(
        circles[0].contains("module profile -> module store: Filter"),
        "{}",
        circles[0]
    );
    assert!(
        circles[0].contains("module store -> module profile: Profile"),
        "{}",
        circles[0]
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_module_composing_its_children_and_tests_using_super_are_no_circle() {
    let dir = scratch(
        "facade",
        &[
            ("lib.rs", "pub mod stage;\n"),
            (
                "stage/mod.rs",
                "mod part;\npub use part::run;\npub struct Error;\nfn go() { part::run(); }\n",
            ),
            (
                "stage/part.rs",
                "use super::Error;\npub fn run() -> Option<Error> { None }\n#[cfg(test)]\nmod tests {\n    use super::*;\n    #[test]\n    fn t() { let _ = super::run(); }\n}\n",
            ),
        ],
    );
    let krate = Crate::read(&dir.join("lib.rs"));
    assert_eq!(krate.modules.len(), 3);
    assert!(krate.circles().is_empty(), "{:?}", krate.circles());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn use_trees_expand_to_every_leaf() {
    let tokens = tokenize("crate::{a::{self, B as C}, d::*, e::F}");
    let leaves = expand(&tokens);
    let paths: Vec<String> = leaves
        .iter()
        .map(|(path, alias)| format!("{}={alias}", path.join("::")))
        .collect();
    assert_eq!(
        paths,
        ["crate::a=a", "crate::a::B=C", "crate::d=*", "crate::e::F=F"]
    );
}

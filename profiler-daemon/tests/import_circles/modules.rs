//! The crate's modules from its root file down, the names each file takes
//! from others, and where those names are defined.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use super::{
    graph::strongly_connected,
    source::{scan, strip},
};

/// A module: its path from the crate root and the file that holds it.
#[derive(Debug)]
pub struct Module {
    path: Vec<String>,
    file: PathBuf,
    /// Children by name, as declared with `mod`.
    children: BTreeMap<String, usize>,
    parent: Option<usize>,
    /// `pub use` names: the exported name -> the path it stands for (relative
    /// to this module, as written).
    exports: HashMap<String, Vec<String>>,
    /// Paths this file names (use trees expanded, inline paths), each with
    /// how many inline `mod x {` it sits in (their `super` is this file).
    uses: Vec<(Vec<String>, usize)>,
}

/// The crate's modules, from its root file down.
pub struct Crate {
    pub modules: Vec<Module>,
}

impl Crate {
    pub fn read(root: &Path) -> Crate {
        let mut modules = Vec::new();
        read_module(root, Vec::new(), None, &mut modules);
        Crate { modules }
    }

    /// Re-exports followed at most, however they chain.
    const MAX_EXPORT_HOPS: u32 = 8;

    /// The module a path names from `from` (with `inline` inline modules
    /// around it), and the item name left after it, through re-exports.
    fn resolve(&self, from: usize, path: &[String], inline: usize) -> Option<usize> {
        self.resolve_within(from, path, inline, Self::MAX_EXPORT_HOPS)
    }

    /// As [`Self::resolve`], following at most `hops` more re-exports.
    fn resolve_within(&self, from: usize, path: &[String], inline: usize, hops: u32) -> Option<usize> {
        let (mut at, rest) = match path.first()?.as_str() {
            "crate" => (0, &path[1..]),
            "self" => (from, &path[1..]),
            "super" => {
                let supers = path.iter().take_while(|segment| *segment == "super").count();
                let mut at = from;
                for _ in 0..supers.saturating_sub(inline) {
                    at = self.modules[at].parent?;
                }
                (at, &path[supers..])
            }
            first if self.modules[from].children.contains_key(first) => (from, path),
            _ => return None,
        };
        for (index, segment) in rest.iter().enumerate() {
            if let Some(&child) = self.modules[at].children.get(segment) {
                at = child;
                continue;
            }
            return Some(self.through_exports(at, &rest[index..], hops));
        }
        Some(at)
    }

    /// Where `name` (the rest of a path in module `at`) is defined: a
    /// re-export sends it on to the module it names.
    fn through_exports(&self, at: usize, rest: &[String], depth: u32) -> usize {
        let Some(target) = self.modules[at].exports.get(&rest[0]) else {
            return at;
        };
        if depth == 0 {
            return at;
        }
        match self.resolve_within(at, target, 0, depth - 1) {
            Some(next) if next != at => {
                // The target path's own last segment is the item there.
                let last = target.last().cloned().unwrap_or_default();
                if self.modules[next].exports.contains_key(&last) {
                    self.through_exports(next, std::slice::from_ref(&last), depth - 1)
                } else {
                    next
                }
            }
            _ => at,
        }
    }

    fn is_inside(&self, module: usize, ancestor: usize) -> bool {
        let mut at = Some(module);
        while let Some(current) = at {
            if current == ancestor {
                return true;
            }
            at = self.modules[current].parent;
        }
        false
    }

    /// File -> files it takes names from, with the names (the last segments).
    fn edges(&self) -> BTreeMap<usize, BTreeMap<usize, BTreeSet<String>>> {
        let mut edges: BTreeMap<usize, BTreeMap<usize, BTreeSet<String>>> = BTreeMap::new();
        for (from, module) in self.modules.iter().enumerate() {
            for (path, inline) in &module.uses {
                let Some(to) = self.resolve(from, path, *inline) else {
                    continue;
                };
                if to == from || self.is_inside(to, from) {
                    continue;
                }
                let name = path.last().cloned().unwrap_or_default();
                edges.entry(from).or_default().entry(to).or_default().insert(name);
            }
        }
        edges
    }

    /// The same edges between modules of one parent: a file's edge to
    /// another counts between the two children of their closest common
    /// module that hold them (`profile/folded.rs` -> `store/query.rs` is
    /// `profile` -> `store`). A circle there is one between files through
    /// the modules' faces, which the file edges alone do not show.
    fn sibling_edges(&self) -> BTreeMap<usize, BTreeMap<usize, BTreeSet<String>>> {
        let mut lifted: BTreeMap<usize, BTreeMap<usize, BTreeSet<String>>> = BTreeMap::new();
        for (from, targets) in self.edges() {
            for (to, names) in targets {
                let from_chain = self.ancestry(from);
                let to_chain = self.ancestry(to);
                let common = from_chain
                    .iter()
                    .zip(&to_chain)
                    .take_while(|(a, b)| a == b)
                    .count();
                let (Some(&a), Some(&b)) = (from_chain.get(common), to_chain.get(common)) else {
                    continue;
                };
                lifted.entry(a).or_default().entry(b).or_default().extend(names);
            }
        }
        lifted
    }

    /// The modules from the crate root down to `module`.
    fn ancestry(&self, module: usize) -> Vec<usize> {
        let mut chain = vec![module];
        while let Some(parent) = self.modules[*chain.last().unwrap_or(&0)].parent {
            chain.push(parent);
        }
        chain.reverse();
        chain
    }

    /// Each circle between files, then between modules of one parent: its
    /// members, and the edges between them.
    pub fn circles(&self) -> Vec<String> {
        let mut circles = Self::circles_of(&self.edges(), self.modules.len(), |at| {
            self.modules[at].file.display().to_string()
        });
        circles.extend(Self::circles_of(
            &self.sibling_edges(),
            self.modules.len(),
            |at| format!("module {}", self.modules[at].path.join("::")),
        ));
        circles
    }

    fn circles_of(
        edges: &BTreeMap<usize, BTreeMap<usize, BTreeSet<String>>>,
        nodes: usize,
        name: impl Fn(usize) -> String,
    ) -> Vec<String> {
        let graph: Vec<Vec<usize>> = (0..nodes)
            .map(|from| {
                edges
                    .get(&from)
                    .map(|to| to.keys().copied().collect())
                    .unwrap_or_default()
            })
            .collect();
        strongly_connected(&graph)
            .into_iter()
            .filter(|component| component.len() > 1)
            .map(|component| {
                let mut text = String::new();
                for &from in &component {
                    for (to, names) in edges.get(&from).into_iter().flatten() {
                        if component.contains(to) {
                            text.push_str(&format!(
                                "  {} -> {}: {}\n",
                                name(from),
                                name(*to),
                                names.iter().cloned().collect::<Vec<_>>().join(", ")
                            ));
                        }
                    }
                }
                text
            })
            .collect()
    }
}

fn read_module(file: &Path, path: Vec<String>, parent: Option<usize>, modules: &mut Vec<Module>) -> usize {
    let text =
        std::fs::read_to_string(file).unwrap_or_else(|err| panic!("reading {}: {err}", file.display()));
    let code = strip(&text);
    let index = modules.len();
    modules.push(Module {
        path: path.clone(),
        file: file.to_path_buf(),
        children: BTreeMap::new(),
        parent,
        exports: HashMap::new(),
        uses: Vec::new(),
    });
    // Children live beside a root or mod.rs file, else in a folder named
    // for the file (`a.rs` and `a/b.rs`).
    let stem = file
        .file_stem()
        .and_then(|stem| stem.to_str())
        .unwrap_or_default();
    let dir = if parent.is_none() || stem == "mod" {
        file.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        file.with_extension("")
    };
    let (declared, uses, exports) = scan(&code, &text);
    for (name, explicit) in declared {
        let child_file = match explicit {
            Some(relative) => file.parent().unwrap_or(Path::new(".")).join(relative),
            None => {
                let flat = dir.join(format!("{name}.rs"));
                if flat.exists() {
                    flat
                } else {
                    dir.join(&name).join("mod.rs")
                }
            }
        };
        let mut child_path = path.clone();
        child_path.push(name.clone());
        let child = read_module(&child_file, child_path, Some(index), modules);
        modules[index].children.insert(name, child);
    }
    modules[index].uses = uses;
    modules[index].exports = exports;
    index
}

//! Rust source read as text: comments and literals blanked, tokens, use
//! trees expanded, module declarations and exports found.

use std::collections::HashMap;

pub type Scanned = (
    Vec<(String, Option<String>)>,
    Vec<(Vec<String>, usize)>,
    HashMap<String, Vec<String>>,
);

/// Out-of-line `mod` declarations (with a `#[path]` if given), the paths
/// named (with their inline-module depth) and the `pub use` exports, from
/// code without comments and literals (`original` for `#[path]` strings).
pub fn scan(code: &str, original: &str) -> Scanned {
    let mut declared = Vec::new();
    let mut uses = Vec::new();
    let mut exports = HashMap::new();
    // Brace depths at which inline modules opened.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let tokens = tokenize(code);
    let mut index = 0;
    while index < tokens.len() {
        let token = tokens[index].as_str();
        match token {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
            }
            "mod" if index + 2 < tokens.len() && is_ident(&tokens[index + 1]) => {
                let name = tokens[index + 1].clone();
                let test_only = cfg_test_before(&tokens[..index]);
                if tokens[index + 2] == ";" {
                    if !test_only {
                        declared.push((name.clone(), path_attribute(original, &name)));
                    }
                } else if tokens[index + 2] == "{" {
                    if test_only {
                        // Tests sit above what they test: skip the block.
                        index = matching_brace(&tokens, index + 2) + 1;
                        continue;
                    }
                    inline.push(depth);
                }
            }
            "use" => {
                let public = index > 0 && (tokens[index - 1] == "pub" || tokens[index - 1] == ")");
                let end = tokens[index..]
                    .iter()
                    .position(|t| t == ";")
                    .map_or(tokens.len(), |at| index + at);
                for (path, alias) in expand(&tokens[index + 1..end]) {
                    if public && !path.is_empty() {
                        exports.insert(alias.clone(), path.clone());
                    }
                    uses.push((path, inline.len()));
                }
                index = end;
                continue;
            }
            "crate" | "super" | "self" if tokens.get(index + 1).is_some_and(|t| t == "::") => {
                let mut path = vec![token.to_owned()];
                let mut at = index + 1;
                while at + 1 < tokens.len() && tokens[at] == "::" && is_ident(&tokens[at + 1]) {
                    path.push(tokens[at + 1].clone());
                    at += 2;
                }
                uses.push((path, inline.len()));
                index = at;
                continue;
            }
            _ => {}
        }
        index += 1;
    }
    (declared, uses, exports)
}

/// Whether the attributes just before a `mod` (and its `pub(...)`) say
/// `#[cfg(test)]`.
fn cfg_test_before(tokens: &[String]) -> bool {
    let mut end = tokens.len();
    // Skip `pub`, `pub(crate)`, `pub(super)`.
    if end >= 4 && tokens[end - 1] == ")" && tokens[end - 4] == "pub" {
        end -= 4;
    } else if end >= 1 && tokens[end - 1] == "pub" {
        end -= 1;
    }
    // Walk back over `#[...]` attributes.
    while end > 0 && tokens[end - 1] == "]" {
        let Some(open) = tokens[..end].iter().rposition(|t| t == "#") else {
            return false;
        };
        let attribute: Vec<&str> = tokens[open..end].iter().map(String::as_str).collect();
        if attribute == ["#", "[", "cfg", "(", "test", ")", "]"] {
            return true;
        }
        end = open;
    }
    false
}

/// The index of the `}` closing the `{` at `open`.
fn matching_brace(tokens: &[String], open: usize) -> usize {
    let mut level = 0usize;
    for (at, token) in tokens.iter().enumerate().skip(open) {
        match token.as_str() {
            "{" => level += 1,
            "}" => {
                level -= 1;
                if level == 0 {
                    return at;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// `#[path = "x.rs"] mod name;` in the original text.
fn path_attribute(original: &str, name: &str) -> Option<String> {
    let declaration = format!("mod {name};");
    let at = original.find(&declaration)?;
    let before = original[..at].trim_end();
    let line = before.lines().last()?.trim();
    let value = line.strip_prefix("#[path = \"")?.strip_suffix("\"]")?;
    Some(value.to_owned())
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && token.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// A use tree's leaves: (path, the name it is known by here).
pub fn expand(tokens: &[String]) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    expand_into(tokens, &[], &mut out);
    out
}

fn expand_into(tokens: &[String], prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let mut path = prefix.to_vec();
    let mut index = 0;
    while index < tokens.len() {
        match tokens[index].as_str() {
            "::" => {}
            "{" => {
                // Split the group's top-level items at commas.
                let mut level = 0;
                let mut start = index + 1;
                let mut at = index + 1;
                while at < tokens.len() {
                    match tokens[at].as_str() {
                        "{" => level += 1,
                        "}" if level == 0 => break,
                        "}" => level -= 1,
                        "," if level == 0 => {
                            expand_into(&tokens[start..at], &path, out);
                            start = at + 1;
                        }
                        _ => {}
                    }
                    at += 1;
                }
                expand_into(&tokens[start..at.min(tokens.len())], &path, out);
                return;
            }
            "*" => {
                out.push((path.clone(), String::from("*")));
                return;
            }
            "as" => {
                let alias = tokens.get(index + 1).cloned().unwrap_or_default();
                out.push((path.clone(), alias));
                return;
            }
            "self" if !path.is_empty() => {}
            segment => path.push(segment.to_owned()),
        }
        index += 1;
    }
    if path.len() > prefix.len() || (!path.is_empty() && tokens.iter().any(|t| t == "self")) {
        let name = path.last().cloned().unwrap_or_default();
        out.push((path, name));
    }
}

/// Identifiers, `::` and single punctuation characters.
pub fn tokenize(code: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut index = 0;
    while index < chars.len() {
        let c = chars[index];
        if c.is_alphanumeric() || c == '_' {
            let start = index;
            while index < chars.len() && (chars[index].is_alphanumeric() || chars[index] == '_') {
                index += 1;
            }
            tokens.push(chars[start..index].iter().collect());
            continue;
        }
        if c == ':' && chars.get(index + 1) == Some(&':') {
            tokens.push(String::from("::"));
            index += 2;
            continue;
        }
        if !c.is_whitespace() {
            tokens.push(c.to_string());
        }
        index += 1;
    }
    tokens
}

/// The code with comments, string and character literals blanked out, so
/// that braces and paths in them count for nothing.
pub fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut index = 0;
    while index < chars.len() {
        let c = chars[index];
        let next = chars.get(index + 1).copied();
        if c == '/' && next == Some('/') {
            while index < chars.len() && chars[index] != '\n' {
                index += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut level = 0;
            while index < chars.len() {
                if chars[index] == '/' && chars.get(index + 1) == Some(&'*') {
                    level += 1;
                    index += 2;
                } else if chars[index] == '*' && chars.get(index + 1) == Some(&'/') {
                    level -= 1;
                    index += 2;
                    if level == 0 {
                        break;
                    }
                } else {
                    index += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !previous_is_ident(&chars, index) {
            // r"..." or r#"..."#
            let mut at = index + 1;
            let mut hashes = 0;
            while chars.get(at) == Some(&'#') {
                hashes += 1;
                at += 1;
            }
            if chars.get(at) != Some(&'"') {
                out.push(c);
                index += 1;
                continue;
            }
            at += 1;
            loop {
                match chars.get(at) {
                    None => break,
                    Some('"') if (0..hashes).all(|h| chars.get(at + 1 + h) == Some(&'#')) => {
                        at += 1 + hashes;
                        break;
                    }
                    _ => at += 1,
                }
            }
            out.push_str("\"\"");
            index = at;
        } else if c == '"' {
            index += 1;
            while index < chars.len() && chars[index] != '"' {
                if chars[index] == '\\' {
                    index += 1;
                }
                index += 1;
            }
            index += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('x', '\n', '{'), or a lifetime ('a).
            let close = if next == Some('\\') {
                chars[index + 2..]
                    .iter()
                    .position(|&c| c == '\'')
                    .map(|at| index + 2 + at)
            } else if chars.get(index + 2) == Some(&'\'') {
                Some(index + 2)
            } else {
                None
            };
            match close {
                Some(close) => {
                    out.push_str("' '");
                    index = close + 1;
                }
                None => {
                    out.push(c);
                    index += 1;
                }
            }
        } else {
            out.push(c);
            index += 1;
        }
    }
    out
}

fn previous_is_ident(chars: &[char], index: usize) -> bool {
    index > 0 && (chars[index - 1].is_alphanumeric() || chars[index - 1] == '_')
}

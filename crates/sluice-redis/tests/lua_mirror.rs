//! The Lua mirror (issue 40): the Lua script, in `src/lua` (its files are
//! `sluice_redis::LUA_FILES`), restates sluice-core's
//! algorithms operation by operation, so that Redis computes the same states
//! bit for bit. `src/lua/mirror.txt` pairs each restated Rust function with
//! its Lua twins and records a digest of each side's source; these tests
//! fail when one side changed without the other, or when a twin or the
//! comment that names its other half is gone. The conformance suite runs
//! both sides; this says which function to look at before it has to.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use proc_macro2::{Delimiter, TokenStream, TokenTree};
use quote::ToTokens;
use sha2::{Digest, Sha256};

/// Set to 1, the digest test records the digests it finds instead.
const BLESS: &str = "SLUICE_BLESS_MIRROR";
const RECORD: &str = "SLUICE_BLESS_MIRROR=1 cargo test -p sluice-redis --test lua_mirror";
/// A digest that was never recorded.
const UNRECORDED: &str = "-";
const RUST_TWIN: &str = "// Twin in sluice-redis's Lua script: ";
const LUA_TWIN: &str = "-- twin of ";

fn crate_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &PathBuf) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---- the table ----

#[derive(Debug, Clone)]
struct Row {
    /// A file in crates/sluice-core/src.
    file: String,
    /// A function, or `Type::name` for a method.
    rust: String,
    lua: Vec<String>,
    rust_digest: String,
    lua_digest: String,
}

impl Row {
    fn lua_list(&self) -> String {
        self.lua.join(", ")
    }

    fn twins(&self) -> &'static str {
        if self.lua.len() > 1 { "twins" } else { "twin" }
    }
}

/// A line of mirror.txt: a comment or blank line, kept as it is, or a row.
enum Line {
    Text(String),
    Row(Row),
}

fn table_path() -> PathBuf {
    crate_file("src/lua/mirror.txt")
}

fn parse_table(text: &str) -> Vec<Line> {
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            if line.trim().is_empty() || line.starts_with('#') {
                return Line::Text(line.to_owned());
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [file, rust, lua, rust_digest, lua_digest] = fields[..] else {
                panic!(
                    "mirror.txt line {}: wants 5 columns (file, Rust function, Lua functions, \
                     Rust digest, Lua digest), has {}: {line}",
                    i + 1,
                    fields.len()
                );
            };
            Line::Row(Row {
                file: file.to_owned(),
                rust: rust.to_owned(),
                lua: lua.split(',').map(str::to_owned).collect(),
                rust_digest: rust_digest.to_owned(),
                lua_digest: lua_digest.to_owned(),
            })
        })
        .collect()
}

fn rows(lines: &[Line]) -> Vec<Row> {
    lines
        .iter()
        .filter_map(|l| match l {
            Line::Row(r) => Some(r.clone()),
            Line::Text(_) => None,
        })
        .collect()
}

/// mirror.txt's text for `lines`, the rows in aligned columns.
fn render_table(lines: &[Line]) -> String {
    let rows = rows(lines);
    let width = |f: fn(&Row) -> usize| rows.iter().map(f).max().unwrap_or(0);
    let (w0, w1, w2) = (
        width(|r| r.file.len()),
        width(|r| r.rust.len()),
        width(|r| r.lua.join(",").len()),
    );
    let mut out = String::new();
    for line in lines {
        match line {
            Line::Text(t) => out.push_str(t),
            Line::Row(r) => out.push_str(&format!(
                "{:<w0$}  {:<w1$}  {:<w2$}  {}  {}",
                r.file,
                r.rust,
                r.lua.join(","),
                r.rust_digest,
                r.lua_digest
            )),
        }
        out.push('\n');
    }
    out
}

fn digest(text: &str) -> String {
    Sha256::digest(text.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// ---- Lua ----

/// A token of Lua source, and the line it starts on.
struct Tok {
    text: String,
    line: usize,
}

/// The level of the long bracket (`[[`, `[=[`, ...) opening at `i`, if one
/// does.
fn long_bracket(c: &[char], i: usize) -> Option<usize> {
    if c.get(i) != Some(&'[') {
        return None;
    }
    let level = c[i + 1..].iter().take_while(|&&x| x == '=').count();
    (c.get(i + 1 + level) == Some(&'[')).then_some(level)
}

/// The index just past the long bracket of `level` opened at `i`.
fn skip_long(c: &[char], i: usize, level: usize, line: &mut usize) -> Result<usize, String> {
    let start = *line;
    let mut j = i + level + 2;
    while j < c.len() {
        if c[j] == '\n' {
            *line += 1;
        } else if c[j] == ']'
            && c[j + 1..].iter().take_while(|&&x| x == '=').count() >= level
            && c.get(j + 1 + level) == Some(&']')
        {
            return Ok(j + level + 2);
        }
        j += 1;
    }
    Err(format!("line {start}: a long bracket that never closes"))
}

/// Lua source as tokens: comments dropped, strings whole, every other
/// character that is not part of a name or number a token of its own.
fn lua_tokens(src: &str) -> Result<Vec<Tok>, String> {
    let c: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        let at = line;
        let start = i;
        if ch == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        if ch.is_whitespace() {
            i += 1;
            continue;
        }
        if ch == '-' && c.get(i + 1) == Some(&'-') {
            match long_bracket(&c, i + 2) {
                Some(level) => i = skip_long(&c, i + 2, level, &mut line)?,
                None => {
                    while i < c.len() && c[i] != '\n' {
                        i += 1;
                    }
                }
            }
            continue;
        }
        if let Some(level) = long_bracket(&c, i) {
            i = skip_long(&c, i, level, &mut line)?;
        } else if ch == '\'' || ch == '"' {
            i += 1;
            loop {
                match c.get(i) {
                    None | Some('\n') => {
                        return Err(format!("line {at}: a string that never closes"));
                    }
                    Some('\\') => {
                        if c.get(i + 1) == Some(&'\n') {
                            line += 1;
                        }
                        i += 2;
                    }
                    Some(&q) if q == ch => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
        } else if ch.is_ascii_digit() {
            let hex = ch == '0' && matches!(c.get(i + 1), Some('x' | 'X'));
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.' || c[i] == '_') {
                // A decimal exponent's sign belongs to the number.
                let exponent = !hex && matches!(c[i], 'e' | 'E');
                i += 1;
                if exponent && matches!(c.get(i), Some('+' | '-')) {
                    i += 1;
                }
            }
        } else if ch.is_ascii_alphabetic() || ch == '_' {
            while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '_') {
                i += 1;
            }
        } else {
            i += 1;
        }
        toks.push(Tok {
            text: c[start..i].iter().collect(),
            line: at,
        });
    }
    Ok(toks)
}

/// The index of the `end` that closes the function whose `function` is
/// token `open`.
fn block_end(toks: &[Tok], open: usize) -> Result<usize, String> {
    let mut depth = 0usize;
    for (i, t) in toks.iter().enumerate().skip(open) {
        match t.text.as_str() {
            "function" | "if" | "do" | "repeat" => depth += 1,
            "end" | "until" => {
                depth -= 1;
                if depth == 0 {
                    return Ok(i);
                }
            }
            _ => {}
        }
    }
    Err(format!(
        "line {}: a function that never ends",
        toks[open].line
    ))
}

/// A function as the table digests it: its line, and its tokens from its
/// signature to its end, one space between each.
#[derive(Debug)]
struct Function {
    line: usize,
    text: String,
}

/// Every `local function` of `src`, by name (a name defined twice has two).
fn lua_functions(src: &str) -> Result<BTreeMap<String, Vec<Function>>, String> {
    let toks = lua_tokens(src)?;
    let mut found: BTreeMap<String, Vec<Function>> = BTreeMap::new();
    for (i, t) in toks.iter().enumerate() {
        if t.text != "local" || toks.get(i + 1).is_none_or(|f| f.text != "function") {
            continue;
        }
        let name = toks.get(i + 2).ok_or("a function without a name")?;
        let end = block_end(&toks, i + 1)?;
        let text: Vec<&str> = toks[i..=end].iter().map(|t| t.text.as_str()).collect();
        found.entry(name.text.clone()).or_default().push(Function {
            line: t.line,
            text: text.join(" "),
        });
    }
    Ok(found)
}

/// The lines just above line `line` (1-based) that `part` accepts, nearest
/// first: a function's comments (and, in Rust, attributes).
fn lines_above<'a>(lines: &[&'a str], line: usize, part: impl Fn(&str) -> bool) -> Vec<&'a str> {
    lines[..line - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .take_while(|l| part(l))
        .collect()
}

fn is_lua_comment(line: &str) -> bool {
    line.starts_with("--")
}

fn is_rust_comment_or_attribute(line: &str) -> bool {
    line.starts_with("#[")
        || (line.starts_with("//") && !line.starts_with("///") && !line.starts_with("//!"))
}

/// The (file, Rust function) pairs a Lua twin comment names:
/// `-- twin of algorithm.rs settle; sliding.rs window_settle, Log::settle`.
fn lua_claims(comment: &str) -> BTreeSet<(String, String)> {
    let mut claims = BTreeSet::new();
    for part in comment.trim_start_matches(LUA_TWIN).split(';') {
        let (file, names) = part.trim().split_once(' ').unwrap_or((part.trim(), ""));
        for name in names.split(',') {
            claims.insert((file.to_owned(), name.trim().to_owned()));
        }
    }
    claims
}

// ---- Rust ----

/// Tokens as text, one space between each: layout and comments (other
/// than doc comments, which a function's body does not hold) do not count.
fn render(tokens: TokenStream, out: &mut String) {
    for tt in tokens {
        match tt {
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Brace => ("{", "}"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                out.push(' ');
                render(g.stream(), out);
                out.push_str(close);
            }
            TokenTree::Ident(i) => out.push_str(&i.to_string()),
            TokenTree::Punct(p) => out.push(p.as_char()),
            TokenTree::Literal(l) => out.push_str(&l.to_string()),
        }
        out.push(' ');
    }
}

fn rust_text(sig: &syn::Signature, block: &syn::Block) -> Function {
    let mut text = String::new();
    render(sig.to_token_stream(), &mut text);
    render(block.to_token_stream(), &mut text);
    Function {
        line: sig.fn_token.span.start().line,
        text: text.trim_end().to_owned(),
    }
}

/// Function `name` (`Type::name` for a method of an inherent impl) of
/// `file`, if it holds exactly one.
fn rust_function(file: &syn::File, name: &str) -> Result<Function, usize> {
    let (ty, name) = match name.split_once("::") {
        Some((ty, name)) => (Some(ty), name),
        None => (None, name),
    };
    let mut found = Vec::new();
    for item in &file.items {
        match (item, ty) {
            (syn::Item::Fn(f), None) if f.sig.ident == name => {
                found.push(rust_text(&f.sig, &f.block))
            }
            (syn::Item::Impl(imp), Some(ty))
                if imp.trait_.is_none()
                    && matches!(&*imp.self_ty, syn::Type::Path(p) if p.path.is_ident(ty)) =>
            {
                for it in &imp.items {
                    if let syn::ImplItem::Fn(f) = it
                        && f.sig.ident == name
                    {
                        found.push(rust_text(&f.sig, &f.block));
                    }
                }
            }
            _ => {}
        }
    }
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(n),
    }
}

// ---- both sides, as the table names them ----

/// A file of the Lua script: its name in src/lua, and its text.
struct LuaFile {
    name: &'static str,
    text: String,
}

/// A `local function` of the Lua script, and the file it is in.
struct LuaFunction {
    file: &'static str,
    function: Function,
}

impl LuaFunction {
    /// Where it is, as `file:line`.
    fn at(&self) -> String {
        format!("{}:{}", self.file, self.function.line)
    }
}

/// The sources the table points into, read once.
struct Sources {
    lua_files: Vec<LuaFile>,
    /// Every `local function` of the script's files, by name.
    lua: BTreeMap<String, Vec<LuaFunction>>,
    /// By file name: the text and the parsed file.
    rust: BTreeMap<String, (String, syn::File)>,
}

impl Sources {
    fn read(rows: &[Row]) -> Sources {
        let lua_files: Vec<LuaFile> = sluice_redis::LUA_FILES
            .iter()
            .map(|&name| LuaFile {
                name,
                text: read(&crate_file(&format!("src/lua/{name}"))),
            })
            .collect();
        let mut lua: BTreeMap<String, Vec<LuaFunction>> = BTreeMap::new();
        for file in &lua_files {
            let found = lua_functions(&file.text).unwrap_or_else(|e| panic!("{}: {e}", file.name));
            for (name, functions) in found {
                lua.entry(name)
                    .or_default()
                    .extend(functions.into_iter().map(|function| LuaFunction {
                        file: file.name,
                        function,
                    }));
            }
        }
        let mut rust = BTreeMap::new();
        for row in rows {
            rust.entry(row.file.clone()).or_insert_with(|| {
                let text = read(&crate_file(&format!("../sluice-core/src/{}", row.file)));
                let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", row.file));
                (text, parsed)
            });
        }
        Sources {
            lua_files,
            lua,
            rust,
        }
    }

    fn rust(&self, row: &Row) -> Result<Function, String> {
        let (_, parsed) = &self.rust[&row.file];
        rust_function(parsed, &row.rust).map_err(|n| match n {
            0 => format!(
                "{} has no function {}, which mirror.txt lists as the Rust twin of the Lua \
                 {}: if it was renamed or moved, update mirror.txt and the twin comments in both files",
                row.file,
                row.rust,
                row.lua_list()
            ),
            n => format!(
                "{} has {n} functions {}: mirror.txt cannot tell which one the Lua {} restates",
                row.file,
                row.rust,
                row.lua_list()
            ),
        })
    }

    fn lua_one(&self, name: &str, row: &Row) -> Result<&Function, String> {
        match self.lua.get(name).map(Vec::as_slice) {
            Some([f]) => Ok(&f.function),
            None | Some([]) => Err(format!(
                "the Lua script has no `local function {name}`, which mirror.txt lists as a Lua twin of \
                 {} {}: if it was renamed or moved, update mirror.txt and the twin comments in both files",
                row.file, row.rust
            )),
            Some(several) => Err(format!(
                "the Lua script defines `local function {name}` {} times ({}): a twin must be one function",
                several.len(),
                several
                    .iter()
                    .map(LuaFunction::at)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// The row's Lua twins' texts, one after the other, in the row's order.
    fn lua(&self, row: &Row) -> Result<String, Vec<String>> {
        let (found, missing): (Vec<_>, Vec<_>) = row
            .lua
            .iter()
            .map(|name| self.lua_one(name, row))
            .partition(Result::is_ok);
        if !missing.is_empty() {
            return Err(missing.into_iter().filter_map(Result::err).collect());
        }
        let texts: Vec<&str> = found
            .into_iter()
            .flatten()
            .map(|f| f.text.as_str())
            .collect();
        Ok(texts.join("\n"))
    }
}

/// What to tell whoever changed one side of `row`, given the digests its
/// sources have now; `None` when they are the ones recorded.
fn drift(row: &Row, rust_digest: &str, lua_digest: &str) -> Option<String> {
    let (file, rust, lua, twins) = (&row.file, &row.rust, row.lua_list(), row.twins());
    if row.rust_digest == UNRECORDED || row.lua_digest == UNRECORDED {
        return Some(format!(
            "{file} {rust} and its Lua {twins} {lua} have no digests recorded yet: check that they \
             compute the same, operation for operation, and then record them with {RECORD}"
        ));
    }
    match (row.rust_digest != rust_digest, row.lua_digest != lua_digest) {
        (false, false) => None,
        (true, false) => Some(format!(
            "{file} {rust} changed but its Lua {twins} {lua} did not: make the same change in {lua} \
             (or, if the change cannot matter to {lua}, say why in the commit) and then re-record \
             with {RECORD}"
        )),
        (false, true) => Some(format!(
            "the Lua {twins} {lua} changed but its Rust twin {file} {rust} did not: make the same change \
             in {rust} (or, if the change cannot matter to {rust}, say why in the commit) and then \
             re-record with {RECORD}"
        )),
        (true, true) => Some(format!(
            "{file} {rust} and its Lua {twins} {lua} both changed: check that they still compute the \
             same, operation for operation (cargo test -p sluice-redis --test conformance runs both), \
             and then re-record with {RECORD}"
        )),
    }
}

#[test]
fn a_lua_twin_and_its_rust_function_change_together_or_the_mirror_says_which_changed() {
    let bless = std::env::var(BLESS).is_ok_and(|v| v == "1");
    let mut lines = parse_table(&read(&table_path()));
    let sources = Sources::read(&rows(&lines));
    let mut problems = Vec::new();
    for line in &mut lines {
        let Line::Row(row) = line else { continue };
        let rust = sources.rust(row);
        let lua = sources.lua(row);
        let (Ok(rust), Ok(lua)) = (&rust, &lua) else {
            problems.extend(rust.err());
            problems.extend(lua.err().into_iter().flatten());
            continue;
        };
        let (rust_digest, lua_digest) = (digest(&rust.text), digest(lua));
        if bless {
            row.rust_digest = rust_digest;
            row.lua_digest = lua_digest;
        } else {
            problems.extend(drift(row, &rust_digest, &lua_digest));
        }
    }
    if bless {
        std::fs::write(table_path(), render_table(&lines)).unwrap();
    }
    assert!(
        problems.is_empty(),
        "the Lua mirror (crates/sluice-redis/src/lua/mirror.txt) is out of step:\n- {}",
        problems.join("\n- ")
    );
}

#[test]
fn every_twin_in_the_mirror_exists_and_names_its_other_half_in_a_comment() {
    let rows = rows(&parse_table(&read(&table_path())));
    let sources = Sources::read(&rows);
    let lua_lines: BTreeMap<&str, Vec<&str>> = sources
        .lua_files
        .iter()
        .map(|f| (f.name, f.text.lines().collect()))
        .collect();
    let mut problems = Vec::new();

    let mut keys = BTreeSet::new();
    for row in &rows {
        if !keys.insert((row.file.clone(), row.rust.clone())) {
            problems.push(format!("mirror.txt lists {} {} twice", row.file, row.rust));
        }
    }

    // Each Rust twin names exactly the row's Lua functions.
    for row in &rows {
        let function = match sources.rust(row) {
            Ok(f) => f,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        let (text, _) = &sources.rust[&row.file];
        let lines: Vec<&str> = text.lines().collect();
        let want = format!("{RUST_TWIN}{}.", row.lua_list());
        let above = lines_above(&lines, function.line, is_rust_comment_or_attribute);
        if !above.contains(&want.as_str()) {
            problems.push(format!(
                "{} {} (line {}) wants the comment `{want}` above it (among its attributes)",
                row.file, row.rust, function.line
            ));
        }
    }
    for (file, (text, _)) in &sources.rust {
        let comments = text
            .lines()
            .filter(|l| l.trim().starts_with(RUST_TWIN))
            .count();
        let listed = rows.iter().filter(|r| &r.file == file).count();
        if comments != listed {
            problems.push(format!(
                "{file} has {comments} twin comments but mirror.txt lists {listed} of its functions: \
                 a twin comment without a row (or a row without one) is out of date"
            ));
        }
    }

    // Each Lua twin's comment names exactly the rows that list it.
    let mut attached: BTreeMap<&str, usize> = BTreeMap::new();
    for (name, functions) in &sources.lua {
        let want: BTreeSet<(String, String)> = rows
            .iter()
            .filter(|r| r.lua.contains(name))
            .map(|r| (r.file.clone(), r.rust.clone()))
            .collect();
        for f in functions {
            let comments: Vec<&str> =
                lines_above(&lua_lines[f.file], f.function.line, is_lua_comment)
                    .into_iter()
                    .filter(|l| l.starts_with(LUA_TWIN))
                    .collect();
            *attached.entry(f.file).or_default() += comments.len();
            let claims: BTreeSet<(String, String)> =
                comments.iter().flat_map(|c| lua_claims(c)).collect();
            if claims != want {
                let show = |s: &BTreeSet<(String, String)>| {
                    s.iter()
                        .map(|(f, n)| format!("{f} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                problems.push(format!(
                    "{name} ({}) says it is the twin of [{}] but mirror.txt lists it for [{}]: one line \
                     `{LUA_TWIN}<file> <function>, ...; <file> ...` above it, as the table says",
                    f.at(),
                    show(&claims),
                    show(&want)
                ));
            }
        }
    }
    for row in &rows {
        for name in &row.lua {
            if let Err(e) = sources.lua_one(name, row) {
                problems.push(e);
            }
        }
    }
    for (file, lines) in &lua_lines {
        let all = lines
            .iter()
            .filter(|l| l.trim().starts_with(LUA_TWIN))
            .count();
        let attached = attached.get(file).copied().unwrap_or(0);
        if all != attached {
            problems.push(format!(
                "{file} has {} twin comments that stand above no `local function`",
                all - attached
            ));
        }
    }

    assert!(
        problems.is_empty(),
        "the Lua mirror's twins:\n- {}",
        problems.join("\n- ")
    );
}

#[test]
fn every_lua_file_beside_the_script_is_one_of_its_files_and_named_once() {
    let dir = crate_file("src/lua");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".lua"))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = sluice_redis::LUA_FILES
        .iter()
        .map(|&name| name.to_owned())
        .collect();
    listed.sort();
    // A file left out of the list would not be in the script, nor would
    // this mirror read its twins.
    assert_eq!(
        on_disk, listed,
        "src/lua's .lua files against sluice-redis's LUA_FILES (script.rs)"
    );
}

// ---- the extraction itself ----

#[test]
fn a_lua_function_ends_at_its_own_end_whatever_its_strings_and_comments_hold() {
    let src = "local function a(x)\n\
               \x20 if x then return 'end' end -- an end\n\
               \x20 for i = 1, 2 do x = x .. [[\nend]] end\n\
               \x20 while x do x = false end\n\
               \x20 repeat x = \"end\" until true\n\
               \x20 local f = function() return 1.5e-3 end\n\
               \x20 --[==[ end\n end ]==]\n\
               \x20 return x\n\
               end\n\
               local function b() end\n";
    let fns = lua_functions(src).unwrap();
    let a = &fns["a"][0];
    assert_eq!(a.line, 1);
    assert!(a.text.ends_with("return x end"), "{}", a.text);
    assert!(
        a.text.contains("[[\nend]]") && a.text.contains("1.5e-3"),
        "{}",
        a.text
    );
    assert!(!a.text.contains("an end"), "{}", a.text);
    assert_eq!(fns["b"][0].text, "local function b ( ) end");
    assert_eq!(fns["b"][0].line, 12);
}

#[test]
fn layout_and_comments_leave_a_digest_alone_but_a_changed_constant_does_not() {
    let lua = |src: &str| digest(&lua_functions(src).unwrap()["f"][0].text);
    let base = lua("local function f(a)\n  return a * 2 -- twice\nend\n");
    assert_eq!(base, lua("local function f( a ) return a*2 end"));
    assert_ne!(base, lua("local function f(a)\n  return a * 3\nend\n"));

    let rust = |src: &str| {
        digest(
            &rust_function(&syn::parse_file(src).unwrap(), "S::f")
                .unwrap()
                .text,
        )
    };
    let base = rust(
        "struct S;\nimpl S {\n    fn f(a: i64) -> i64 {\n        // twice\n        a * 2\n    }\n}\n",
    );
    assert_eq!(base, rust("struct S; impl S { fn f(a:i64)->i64{a*2} }"));
    assert_ne!(
        base,
        rust("struct S; impl S { fn f(a: i64) -> i64 { a * 3 } }")
    );
}

#[test]
fn a_change_on_one_side_names_that_side_and_the_twin_to_change() {
    let row = Row {
        file: "algorithm.rs".into(),
        rust: "fw_roll".into(),
        lua: vec!["refill".into()],
        rust_digest: "r".into(),
        lua_digest: "l".into(),
    };
    assert_eq!(drift(&row, "r", "l"), None);
    let rust = drift(&row, "r2", "l").unwrap();
    assert!(
        rust.starts_with("algorithm.rs fw_roll changed but its Lua twin refill did not: make the same change in refill"),
        "{rust}"
    );
    assert!(rust.ends_with(RECORD), "{rust}");
    let lua = drift(&row, "r", "l2").unwrap();
    assert!(
        lua.starts_with(
            "the Lua twin refill changed but its Rust twin algorithm.rs fw_roll did not"
        ),
        "{lua}"
    );
    let both = drift(&row, "r2", "l2").unwrap();
    assert!(both.contains("both changed"), "{both}");
}

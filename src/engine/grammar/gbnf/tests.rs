use super::*;

fn lark(gbnf: &str) -> String {
    to_lark(gbnf).unwrap_or_else(|e| panic!("{gbnf:?}: {e}"))
}

fn error(gbnf: &str) -> GbnfError {
    to_lark(gbnf).expect_err(gbnf)
}

#[test]
fn a_rule_becomes_one_lark_line_reached_from_start() {
    assert_eq!(
        lark(r#"root ::= "a"{5,5}"#),
        "start: g_root\ng_root: \"a\"{5,5}\n"
    );
    assert_eq!(
        lark("root ::= item+ | \"x\"?\nitem ::= [a-z0-9] .*"),
        "start: g_root\ng_item: /[a-z0-9]/ /(?s:.)/*\ng_root: g_item+ | \"x\"?\n"
    );
}

#[test]
fn newlines_end_a_rule_only_where_llama_cpp_ends_one() {
    // As llama.cpp's json.gbnf is written: the body on the next lines, inside
    // parentheses, and alternatives after a trailing `|`; comments anywhere.
    let gbnf = "# a comment\nroot ::=\n  \"{\" ws (\n    \"a\" # inside\n    | \"b\"\n  )* \"}\" |\n  \"x\"\n\nws ::= [ \\t\\n]*\n";
    assert_eq!(
        lark(gbnf),
        "start: g_root\n\
         g_root: \"{\" g_ws (\"a\" | \"b\")* \"}\" | \"x\"\n\
         g_ws: /[\\x{20}\\x{9}\\x{A}]/*\n"
    );
    // A newline at the top level ends the rule: what follows must be a new rule.
    let e = error("root ::= \"a\"\n  \"b\"");
    assert_eq!((e.line, e.column), (2, 3), "{e}");
}

#[test]
fn names_stay_apart_whatever_their_case() {
    let out = lark("root ::= Item-2 item-2\nItem-2 ::= \"A\"\nitem-2 ::= \"a\"");
    assert!(out.contains("g__item-2: \"A\"\n"), "{out}");
    assert!(out.contains("g_item-2: \"a\"\n"), "{out}");
    assert!(out.contains("g_root: g__item-2 g_item-2\n"), "{out}");
}

#[test]
fn literals_and_classes_keep_every_character_literal() {
    // Escapes as llama.cpp reads them, written back as JSON (literals) or code points
    // (classes), so nothing is read as Lark or regex syntax.
    assert_eq!(
        lark(r#"root ::= "q\"\\\x41\u00e9\U0001F600/\t" [\]^/\[-] [^"\n]"#),
        "start: g_root\ng_root: \"q\" \"\\\"\" \"\\\\\" \"A\" \"é\" \"😀\" \"/\" \"\\t\" /[\\x{5D}\\x{5E}\\x{2F}\\x{5B}\\x{2D}]/ /[^\\x{22}\\x{A}]/\n"
    );
    assert_eq!(
        lark("root ::= \"\u{7f}\""),
        "start: g_root\ng_root: \"\\u007f\"\n"
    );
    // A dash last in a class is the character itself.
    assert_eq!(
        lark("root ::= [a-]"),
        "start: g_root\ng_root: /[a\\x{2D}]/\n"
    );
}

#[test]
fn repetitions_map_to_lark_counts() {
    assert_eq!(
        lark(r#"root ::= "a"{3} "b"{2,} "c"{0,4} "d"{0} ("e" "f"){1,2} "g"*?"#),
        "start: g_root\ng_root: \"a\"{3,3} \"b\"{2,} \"c\"{0,4} \"\" (\"e\" \"f\"){1,2} (\"g\"*)?\n"
    );
    assert_eq!(
        lark("root ::= \"\" | \"a\""),
        "start: g_root\ng_root: \"\" | \"a\"\n"
    );
    assert_eq!(lark("root ::= ( )"), "start: g_root\ng_root: (\"\")\n");
    // A literal of several characters repeats whole.
    assert_eq!(
        lark(r#"root ::= "ab"* "na"{3}"#),
        "start: g_root\ng_root: (\"a\" \"b\")* (\"n\" \"a\"){3,3}\n"
    );
}

#[test]
fn what_is_not_gbnf_is_refused_with_where() {
    for (gbnf, message, at) in [
        ("root ::= this is (not valid GBNF", "expected ')'", (1, 33)),
        ("item ::= \"a\"", "no 'root' rule", (1, 13)),
        ("root ::= other", "'other' is not defined", (1, 10)),
        ("root ::= \"a\"\nroot ::= \"b\"", "defined twice", (2, 1)),
        ("root = \"a\"", "expected '::='", (1, 6)),
        ("root ::= \"a", "ends inside a literal", (1, 12)),
        ("root ::= [a", "ends inside a character class", (1, 12)),
        ("root ::= \"\\q\"", "unknown escape '\\q'", (1, 11)),
        ("root ::= \"\\xZZ\"", "is not a character", (1, 11)),
        ("root ::= \"\\uD800\"", "is not a character", (1, 11)),
        ("root ::= []", "matches nothing", (1, 10)),
        ("root ::= [z-a]", "is empty", (1, 14)),
        ("root ::= * \"a\"", "follows nothing", (1, 10)),
        ("root ::= \"a\"{2", "expected ',' or '}'", (1, 15)),
        ("root ::= \"a\"{2,1}", "below the least", (1, 18)),
        ("root ::= \"a\"{x}", "expected a number", (1, 14)),
        ("root ::= \"a\"{2001}", "at most 2000", (1, 14)),
        ("root ::= \"a\"{99999999999}", "at most 2000", (1, 14)),
        ("root ::= \"\\x+1\"", "is not a character", (1, 11)),
        (
            "root ::= \"a\"*+?*+",
            "more than 4 repetition operators",
            (1, 17),
        ),
        ("root ::= <[42]>", "token references", (1, 10)),
        ("root ::= \"a\" )", "unexpected ')'", (1, 14)),
        ("::= \"a\"", "expected a rule name, found ':'", (1, 1)),
    ] {
        let e = error(gbnf);
        assert!(e.message.contains(message), "{gbnf:?}: {e}");
        assert_eq!((e.line, e.column), at, "{gbnf:?}: {e}");
    }
    assert_eq!(
        error("").to_string(),
        "the grammar has no 'root' rule (line 1, column 1)"
    );
}

#[test]
fn crlf_line_ends_are_line_ends() {
    assert_eq!(
        lark("root ::= a\r\na ::= \"x\"\r\n"),
        "start: g_root\ng_a: \"x\"\ng_root: g_a\n"
    );
}

use super::*;

fn config(line: &str, value: &str) -> Result<String, Refusal> {
    let mut out = line.as_bytes().to_vec();
    escape_config(value, config_place(line.as_bytes()), &mut out)?;
    Ok(String::from_utf8(out).unwrap())
}

fn map(line: &str, value: &str) -> Result<String, Refusal> {
    let mut out = line.as_bytes().to_vec();
    escape_map(value, map_place(line.as_bytes()), &mut out)?;
    Ok(String::from_utf8(out).unwrap())
}

#[test]
fn plain_values_are_left_alone() {
    for value in [
        "web",
        "10.0.0.1",
        "be_default_web",
        "api.example.test",
        "/login",
        "",
    ] {
        assert!(!needs_escaping(value), "{value}");
    }
    for value in [
        "a b",
        "%[env(X)]",
        "${X}",
        "a\"b",
        "a'b",
        "a#b",
        "a\\b",
        "a\nb",
        "a\u{85}",
    ] {
        assert!(needs_escaping(value), "{value:?}");
    }
}

#[test]
fn a_marker_inside_a_value_cannot_end_it_and_is_refused() {
    let outer = wrap(&format!("x{VALUE_END}\nlisten evil"));
    assert_eq!(
        outer,
        format!("{VALUE_START}x{INNER_MARKER}\nlisten evil{VALUE_END}")
    );
    assert_eq!(
        config("    server ", &format!("x{INNER_MARKER}")),
        Err(Refusal::Noncharacter(INNER_MARKER))
    );
}

#[test]
fn bare_words_escape_what_would_split_or_expand_them() {
    assert_eq!(
        config("    server ", "a b#c\"d'e\\f$g").unwrap(),
        "    server a\\ b\\#c\\\"d\\'e\\\\f$g"
    );
    // `%` is plain text outside log-format arguments.
    assert_eq!(
        config("    acl p path_beg ", "/a%20b").unwrap(),
        "    acl p path_beg /a%20b"
    );
}

#[test]
fn quoted_strings_escape_quotes_backslashes_and_expansions() {
    assert_eq!(
        config(
            "    http-request return status 200 string \"",
            "a \"b\" ${X} # 'c' \\"
        )
        .unwrap(),
        "    http-request return status 200 string \"a \\\"b\\\" \\${X} # 'c' \\\\"
    );
    assert_eq!(
        config("    http-request return status 200 string '", "it's ${X}").unwrap(),
        "    http-request return status 200 string 'it'\\''s ${X}"
    );
}

#[test]
fn log_format_arguments_double_percent_signs() {
    let cases = [
        ("    http-request redirect location ", true),
        ("    http-request redirect prefix \"", true),
        ("    http-request set-header X-A ", true),
        ("    http-response add-header X-A \"v=", true),
        ("    http-request set-path ", true),
        ("    http-request replace-path ^/a(.*) ", true),
        ("    http-request replace-path ", false),
        ("    http-request return status 200 lf-string ", true),
        ("    http-request return status 200 hdr X-A ", true),
        ("    http-request return status 200 string ", false),
        ("    http-request set-var-fmt(txn.a) ", true),
        ("    http-request set-header X-A b if ", false),
        ("    log-format ", true),
        ("    use_backend be_", true),
        ("    default_backend be_", false),
        ("    redirect location ", true),
        ("    tcp-request content set-var-fmt(txn.a) ", true),
        ("    server s1 ", false),
    ];
    for (line, logformat) in cases {
        let expected = if logformat { "%%[env(X)]" } else { "%[env(X)]" };
        let out = config(line, "%[env(X)]").unwrap();
        assert!(out.ends_with(expected), "{line:?}: {out:?}");
    }
}

#[test]
fn comments_take_values_as_they_are_but_never_a_line_break() {
    assert_eq!(
        config("    # backend ", "a \"b\" %[x]").unwrap(),
        "    # backend a \"b\" %[x]"
    );
    assert_eq!(
        config("    # backend ", "a\nlisten x"),
        Err(Refusal::Control('\n'))
    );
}

#[test]
fn control_characters_and_noncharacters_are_refused_everywhere() {
    for value in ["a\nb", "a\rb", "a\0b", "a\tb", "a\u{7f}", "a\u{85}b"] {
        let c = value.chars().find(|c| c.is_control()).unwrap();
        assert_eq!(config("    server ", value), Err(Refusal::Control(c)));
        assert_eq!(config("    server \"", value), Err(Refusal::Control(c)));
        assert_eq!(map("key ", value), Err(Refusal::Control(c)));
    }
    assert_eq!(
        config("    server ", "a\u{FDD1}"),
        Err(Refusal::Noncharacter('\u{FDD1}'))
    );
}

#[test]
fn a_word_continues_after_template_text_and_after_escapes() {
    // `be_\ x` : the escaped space keeps the word open, so `%` in a use_backend name
    // is still in the backend-name word.
    assert_eq!(
        config("    use_backend be\\ x", "%").unwrap(),
        "    use_backend be\\ x%%"
    );
    assert!(config_place(b"    http-request set-header X-A \"a b").logformat);
    assert_eq!(config_place(b"    server a \"x").quote, Quote::Double);
    assert_eq!(config_place(b"    server a \"x\" ").quote, Quote::None);
    assert!(config_place(b"    server a # x").comment);
    assert!(!config_place(b"    server a \"# x").comment);
}

#[test]
fn map_keys_refuse_whitespace_and_a_leading_hash() {
    assert_eq!(map("", "a.test").unwrap(), "a.test");
    assert_eq!(map("", "a b"), Err(Refusal::MapKeySpace));
    assert_eq!(map("pre", "a b"), Err(Refusal::MapKeySpace));
    assert_eq!(map("", "#a"), Err(Refusal::MapKeyComment));
    assert_eq!(map("a", "#b").unwrap(), "a#b");
    assert_eq!(
        map("a.test ", "be a %[x] ${y}").unwrap(),
        "a.test be a %[x] ${y}"
    );
    assert_eq!(map("# note ", "a b").unwrap(), "# note a b");
}

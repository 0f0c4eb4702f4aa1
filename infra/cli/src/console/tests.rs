use super::*;

#[test]
fn only_the_consoles_own_pages_may_post_to_it() {
    let host = Some("127.0.0.1:8470");
    let own = Some("http://127.0.0.1:8470");
    assert!(allowed(8470, "GET", host, None, None, None));
    assert!(allowed(
        8470,
        "GET",
        Some("localhost:8470"),
        None,
        None,
        None
    ));
    assert!(!allowed(
        8470,
        "GET",
        Some("evil.example:8470"),
        None,
        None,
        None
    ));
    assert!(!allowed(8470, "GET", None, None, None, None));
    assert!(allowed(8470, "POST", host, own, None, None));
    assert!(allowed(
        8470,
        "POST",
        host,
        None,
        Some("http://127.0.0.1:8470/executions/x"),
        None
    ));
    assert!(!allowed(
        8470,
        "POST",
        host,
        Some("https://evil.example"),
        None,
        None
    ));
    assert!(!allowed(8470, "POST", host, Some("null"), None, None));
    assert!(!allowed(
        8470,
        "POST",
        host,
        None,
        Some("http://127.0.0.1:8470.evil/"),
        None
    ));
    assert!(!allowed(8470, "POST", host, None, None, None));
}

#[test]
fn a_page_of_another_site_cannot_make_the_console_act() {
    // A cross-site image or link to the dead-letter page (which receives and releases
    // messages) carries the console's own Host; the browser's fetch metadata tells it apart.
    let host = Some("127.0.0.1:8470");
    for site in ["cross-site", "same-site"] {
        assert!(
            !allowed(8470, "GET", host, None, None, Some(site)),
            "{site}"
        );
    }
    for site in ["same-origin", "none"] {
        assert!(allowed(8470, "GET", host, None, None, Some(site)), "{site}");
    }
    assert!(!allowed(
        8470,
        "POST",
        host,
        Some("http://127.0.0.1:8470"),
        None,
        Some("cross-site")
    ));
}

#[test]
fn form_fields_decode_as_browsers_encode_them() {
    // Not a percent escape: kept as written ('+' is a space), never read as a byte.
    assert_eq!(form_fields("x=%+4")["x"], "% 4");
    assert_eq!(form_fields("x=%41%42")["x"], "AB");
    assert_eq!(form_fields("x=100%")["x"], "100%");
    assert_eq!(form_fields("x=%E2%82%AC")["x"], "€");
}

#[test]
fn forms_decode_and_text_is_escaped() {
    let f = form_fields("payload=%7B%22by%22%3A%22ana%22%7D&verdict=APPROVED&reason=no+truffles");
    assert_eq!(f["payload"], "{\"by\":\"ana\"}");
    assert_eq!(f["reason"], "no truffles");
    assert_eq!(
        esc("<a href=\"x\">&</a>"),
        "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
    );
    assert_eq!(enc("a b/c"), "a%20b%2Fc");
}

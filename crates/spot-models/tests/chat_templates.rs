//! Chat templates rendered in Rust against transformers' `apply_chat_template` outputs
//! (fixture made by tools/oracle/chat_oracle.py from each family's published template).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use serde::Deserialize;
use spot_models::ModelError;
use spot_models::chat::{ChatTemplate, Message};

#[derive(Deserialize)]
struct Fixture {
    templates: Vec<Template>,
}

#[derive(Deserialize)]
struct Template {
    family: String,
    template: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: serde_json::Value,
    add_generation_prompt: bool,
    expected: String,
}

#[test]
fn every_family_template_renders_like_transformers() {
    let text = std::fs::read_to_string(common::fixture("chat_templates.json")).unwrap();
    let f: Fixture = serde_json::from_str(&text).unwrap();
    let mut n = 0;
    let mut families = Vec::new();
    for t in &f.templates {
        let tmpl =
            ChatTemplate::new(&t.template, t.bos_token.as_deref(), t.eos_token.as_deref()).unwrap();
        for c in &t.cases {
            let got = tmpl.render(&c.messages, c.add_generation_prompt).unwrap();
            assert_eq!(
                got, c.expected,
                "{} {} (gen {})",
                t.family, c.name, c.add_generation_prompt
            );
            n += 1;
        }
        families.push(t.family.clone());
    }
    eprintln!("{n} renderings equal over {families:?}");
    assert!(n >= 100, "{n}");
}

#[test]
fn templates_load_from_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    // No tokenizer_config.json: a typed error naming the field.
    match ChatTemplate::from_dir(p) {
        Err(ModelError::InvalidConfig { field, .. }) => assert_eq!(field, "chat_template"),
        other => panic!("{other:?}"),
    }
    // Named templates, tokens as AddedToken objects.
    std::fs::write(
        p.join("tokenizer_config.json"),
        r#"{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "x"},
                              {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}"}]}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_dir(p).unwrap();
    assert_eq!(
        t.render(&[Message::user("hi")], false).unwrap(),
        "<s>[user]hi</s>"
    );
    // chat_template.jinja wins over the JSON field.
    std::fs::write(
        p.join("chat_template.jinja"),
        "{{ messages[0].content | upper }}",
    )
    .unwrap();
    let t = ChatTemplate::from_dir(p).unwrap();
    assert_eq!(t.render(&[Message::user("hi")], true).unwrap(), "HI");
    // A malformed template is a typed error naming the file.
    std::fs::write(p.join("chat_template.jinja"), "{% if %}").unwrap();
    let e = ChatTemplate::from_dir(p).unwrap_err();
    assert!(
        matches!(e, ModelError::ChatTemplate { .. })
            && e.to_string().contains("chat_template.jinja"),
        "{e}"
    );
}

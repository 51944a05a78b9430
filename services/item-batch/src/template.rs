//! The per-item command: an argv whose arguments may hold `{uri}`, `{output}`, `{item}` and
//! `{attempt}` (`{{` and `}}` are literal braces), or a built-in run by the agent itself:
//! `kiln:noop` (succeeds at once) or `kiln:sleep MS` (succeeds after MS milliseconds; for
//! simulations and benchmarks).

/// The placeholders a command may use.
pub const PLACEHOLDERS: [&str; 4] = ["uri", "output", "item", "attempt"];
/// Built-ins run by the agent itself, without a process.
pub const BUILTINS: [&str; 2] = ["kiln:noop", "kiln:sleep"];

/// What a placeholder stands for in one attempt.
#[derive(Debug, Clone, Copy)]
pub struct Values<'a> {
    pub uri: &'a str,
    pub output: &'a str,
    pub item: &'a str,
    pub attempt: u32,
}

enum Piece<'a> {
    Text(&'a str),
    Brace(char),
    Placeholder(&'a str),
}

fn pieces(arg: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = arg;
    while !rest.is_empty() {
        if let Some(tail) = rest.strip_prefix("{{") {
            out.push(Piece::Brace('{'));
            rest = tail;
        } else if let Some(tail) = rest.strip_prefix("}}") {
            out.push(Piece::Brace('}'));
            rest = tail;
        } else if let Some(tail) = rest.strip_prefix('{') {
            let end = tail.find('}').ok_or_else(|| {
                format!("argument {arg:?} opens a placeholder it does not close (write {{{{ for a brace)")
            })?;
            let name = &tail[..end];
            if !PLACEHOLDERS.contains(&name) {
                return Err(format!(
                    "unknown placeholder {{{name}}} in {arg:?}; the placeholders are {{uri}}, {{output}}, {{item}} and {{attempt}}"
                ));
            }
            out.push(Piece::Placeholder(name));
            rest = &tail[end + 1..];
        } else if rest.starts_with('}') {
            return Err(format!("argument {arg:?} has a stray '}}' (write }}}} for a brace)"));
        } else {
            let end = rest.find(['{', '}']).unwrap_or(rest.len());
            out.push(Piece::Text(&rest[..end]));
            rest = &rest[end..];
        }
    }
    Ok(out)
}

/// Checks a command template; the message says what is wrong.
pub fn validate(command: &[String]) -> Result<(), String> {
    let Some(program) = command.first() else {
        return Err("the command is empty: give the program to run per item".into());
    };
    if program.is_empty() {
        return Err("the command's program is empty".into());
    }
    if let Some(name) = program.strip_prefix("kiln:") {
        if !BUILTINS.contains(&program.as_str()) {
            return Err(format!(
                "unknown built-in kiln:{name}; the built-ins are {}",
                BUILTINS.join(", ")
            ));
        }
        return match (program.as_str(), &command[1..]) {
            ("kiln:noop", []) => Ok(()),
            ("kiln:sleep", [ms]) if ms.parse::<u64>().is_ok_and(|ms| ms <= 3_600_000) => Ok(()),
            ("kiln:sleep", _) => Err("kiln:sleep takes one argument: milliseconds, at most 3600000".into()),
            _ => Err(format!("the built-in {program} takes no arguments")),
        };
    }
    for arg in command {
        pieces(arg)?;
    }
    Ok(())
}

/// Fills in a validated template.
pub fn render(command: &[String], values: Values<'_>) -> Vec<String> {
    command
        .iter()
        .map(|arg| {
            let mut out = String::with_capacity(arg.len());
            for piece in pieces(arg).unwrap_or_default() {
                match piece {
                    Piece::Text(text) => out.push_str(text),
                    Piece::Brace(brace) => out.push(brace),
                    Piece::Placeholder("uri") => out.push_str(values.uri),
                    Piece::Placeholder("output") => out.push_str(values.output),
                    Piece::Placeholder("item") => out.push_str(values.item),
                    Piece::Placeholder(_) => out.push_str(&values.attempt.to_string()),
                }
            }
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn placeholders_are_filled_in_and_braces_escaped() {
        let command = argv(&["sh", "-c", "cp {uri} {output}/x.{item} && echo {{{attempt}}}"]);
        validate(&command).unwrap();
        let values = Values {
            uri: "s3://b/k",
            output: "/out",
            item: "k1",
            attempt: 2,
        };
        assert_eq!(render(&command, values)[2], "cp s3://b/k /out/x.k1 && echo {2}");
    }

    #[test]
    fn bad_templates_are_named() {
        assert!(validate(&[]).unwrap_err().contains("empty"));
        assert!(
            validate(&argv(&["echo", "{url}"]))
                .unwrap_err()
                .contains("unknown placeholder {url}")
        );
        assert!(
            validate(&argv(&["echo", "{uri"]))
                .unwrap_err()
                .contains("does not close")
        );
        assert!(validate(&argv(&["echo", "a}b"])).unwrap_err().contains("stray"));
        assert!(
            validate(&argv(&["kiln:teleport"]))
                .unwrap_err()
                .contains("unknown built-in")
        );
        assert!(validate(&argv(&["kiln:noop", "x"])).is_err());
        validate(&argv(&["kiln:noop"])).unwrap();
        validate(&argv(&["kiln:sleep", "250"])).unwrap();
        assert!(validate(&argv(&["kiln:sleep"])).is_err());
        assert!(validate(&argv(&["kiln:sleep", "soon"])).is_err());
    }
}

//! `kvcore chat`: a multi-turn conversation in the terminal.
//!
//! Each line read from stdin is a user turn. The whole conversation (every message so
//! far and the new one) is rendered with the model's own chat template and handed to
//! [`model::generate`] on one [`Session`], which keeps every cached position the new
//! rendering shares with the last one and prefills only the rest. The reply streams to
//! stdout and joins the conversation as an assistant message; the turn's statistics go
//! to stderr, or, with `--json`, one JSON object per turn goes to stdout instead.
//!
//! Lines starting with `/` are commands: `/reset`, `/save FILE`, `/load FILE`, `/help`
//! (`//` sends a message that starts with `/`). `/save` writes the session with the
//! messages as the file's application blob (JSON); `/load` restores both, and on any
//! error keeps the current conversation. A turn that runs into `--ctx` is dropped with a
//! message saying so: the conversation stays as it was before it, and `/reset` starts
//! over. End of input (Ctrl-D) ends the chat with status 0.

use crate::ChatArgs;
use crate::backends::{self, Job};
use crate::commands::{
    Printer, TextModel, chat_ids, check_n, context_full, generate_params, load_model,
    print_turn_stats, split_result, stats_json, system_messages, threads,
};
use anyhow::Context;
use kvcore::gguf::GgufFile;
use kvcore::model::{self, Decoder, GenerateParams, Generation, Llama, ModelError, Sampler};
use kvcore::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use kvcore::{Backend, KvError, KvStore, Session};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;

const HELP: &str = "\
Type a message and press Enter; the reply streams back. Commands:
  /reset       forget the conversation and start a new one
  /save FILE   save the conversation (messages and KV cache) to FILE
  /load FILE   continue the conversation saved in FILE
  /help        this text
  //text       send a message that starts with '/'
Ctrl-D ends the chat.";

pub fn chat(a: ChatArgs) -> anyhow::Result<ExitCode> {
    a.store.check()?;
    check_n(a.n)?;
    let params = generate_params(&a.sampling.sampling()?, a.n, &a.reply.stop);
    let threads = threads(&a.model)?;
    let (file, tok, template) = TextModel::open(&a.model)?.into_template()?;
    a.sampling.check_vocab(&tok)?;
    let job = ChatJob {
        file,
        tok,
        template,
        params,
        args: a,
    };
    backends::dispatch(job.args.model.backend, threads, job.args.model.kernels, job)
}

struct ChatJob {
    file: GgufFile,
    tok: Tokenizer,
    template: ChatTemplate,
    params: GenerateParams,
    args: ChatArgs,
}

impl Job for ChatJob {
    type Output = ExitCode;
    fn run<B: Backend>(self, b: B) -> anyhow::Result<ExitCode> {
        let ChatJob {
            file,
            tok,
            template,
            params,
            args,
        } = self;
        let model = load_model(file, b, args.compute.activations)?;
        let max_ctx = args.store.max_ctx(&model)?;
        let session = Session::new(args.store.new_store(&model, max_ctx)?);
        let mut chat = Chat {
            model: &model,
            tok: &tok,
            template: &template,
            args: &args,
            max_ctx,
            session,
            messages: system_messages(&args.reply),
            params,
            sampler: None,
            turns: 0,
        };
        chat.run()?;
        Ok(ExitCode::SUCCESS)
    }
}

/// The conversation's messages as `/save` stores them in the session file's blob.
#[derive(Serialize, Deserialize)]
struct SavedChat {
    format: String,
    messages: Vec<SavedMessage>,
}

#[derive(Serialize, Deserialize)]
struct SavedMessage {
    role: String,
    content: String,
}

/// `format` of a [`SavedChat`].
const SAVED_FORMAT: &str = "kvcore-chat-1";

/// One conversation: the model, the session holding its cached positions and the
/// messages so far.
struct Chat<'a, B: Backend> {
    model: &'a Llama<B>,
    tok: &'a Tokenizer,
    template: &'a ChatTemplate,
    args: &'a ChatArgs,
    max_ctx: usize,
    session: Session<Box<dyn KvStore>>,
    messages: Vec<ChatMessage>,
    params: GenerateParams,
    /// The last turn's sampler: the next turn continues its draws.
    sampler: Option<Sampler>,
    /// User turns so far (the number of the current one while it runs).
    turns: usize,
}

impl<B: Backend> Chat<'_, B> {
    /// Reads stdin to its end, one turn or command per line.
    fn run(&mut self) -> anyhow::Result<()> {
        let stdin = std::io::stdin();
        let interactive = stdin.is_terminal();
        if interactive {
            eprintln!("kvcore chat: type a message, /help for commands, Ctrl-D to quit");
        }
        let mut input = stdin.lock();
        let mut line = Vec::new();
        loop {
            if interactive {
                eprint!("> ");
            }
            line.clear();
            if input.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            let Ok(text) = std::str::from_utf8(&line) else {
                eprintln!("kvcore: the line is not valid UTF-8; it was ignored");
                continue;
            };
            let text = text.trim_end_matches(['\n', '\r']);
            if text.trim().is_empty() {
                continue;
            }
            match text.strip_prefix('/') {
                Some(rest) if !rest.starts_with('/') => self.command(rest),
                Some(rest) => self.turn(rest)?,
                None => self.turn(text)?,
            }
        }
        if interactive {
            eprintln!();
        }
        Ok(())
    }

    fn command(&mut self, line: &str) {
        let (name, arg) = match line.split_once(char::is_whitespace) {
            Some((name, arg)) => (name, arg.trim()),
            None => (line, ""),
        };
        match (name, arg) {
            ("help", _) => eprintln!("{HELP}"),
            ("reset", _) => {
                self.session.clear();
                self.messages = system_messages(&self.args.reply);
                eprintln!("[conversation reset]");
            }
            ("save", "") | ("load", "") => eprintln!("kvcore: usage: /{name} FILE"),
            ("save", path) => match self.save(Path::new(path)) {
                Ok(()) => eprintln!(
                    "[saved {} messages and {} positions to {path}]",
                    self.messages.len(),
                    self.session.len()
                ),
                Err(e) => eprintln!("kvcore: {e:#}"),
            },
            ("load", path) => match self.load(Path::new(path)) {
                Ok(()) => eprintln!(
                    "[loaded {} messages and {} positions from {path}]",
                    self.messages.len(),
                    self.session.len()
                ),
                Err(e) => eprintln!("kvcore: {e:#}; the conversation is unchanged"),
            },
            _ => eprintln!("kvcore: unknown command /{name} (/help lists the commands)"),
        }
    }

    fn save(&self, path: &Path) -> anyhow::Result<()> {
        let saved = SavedChat {
            format: SAVED_FORMAT.to_string(),
            messages: self
                .messages
                .iter()
                .map(|m| SavedMessage {
                    role: m.role.clone(),
                    content: m.content.clone(),
                })
                .collect(),
        };
        let meta = serde_json::to_vec(&saved)?;
        self.session
            .save_with_meta(self.model, path, &meta)
            .with_context(|| format!("cannot save {}", path.display()))
    }

    fn load(&mut self, path: &Path) -> anyhow::Result<()> {
        let messages = self
            .session
            .restore_with(self.model, path, |meta| {
                let saved: SavedChat =
                    serde_json::from_slice(meta).map_err(|e| format!("not a kvcore chat ({e})"))?;
                if saved.format != SAVED_FORMAT {
                    return Err(format!("unknown chat format {:?}", saved.format));
                }
                Ok(saved
                    .messages
                    .into_iter()
                    .map(|m| ChatMessage::new(m.role, m.content))
                    .collect())
            })
            .with_context(|| format!("cannot load {}", path.display()))?;
        self.messages = messages;
        Ok(())
    }

    /// One user turn: render, generate (streaming), report. A turn that cannot run, or
    /// fails part-way, is reported and dropped from the conversation; only a failure to
    /// write to stdout is an error.
    fn turn(&mut self, text: &str) -> anyhow::Result<()> {
        self.turns += 1;
        self.messages.push(ChatMessage::new("user", text));
        let (generation, error) = match self.prompt() {
            Err(message) => (None, Some(message)),
            Ok(ids) => {
                let Reply {
                    generation,
                    failure,
                    text,
                    stop,
                } = self.reply(&ids)?;
                let error = failure.map(|e| match e {
                    ModelError::Kv(KvError::ContextOverflow { max_ctx, .. }) => format!(
                        "the context of {max_ctx} positions (--ctx) is full after {} generated tokens; the turn was dropped: /reset starts a new conversation",
                        generation.tokens.len()
                    ),
                    other => format!("generation failed ({other}); the turn was dropped"),
                });
                (Some((generation, text, stop)), error)
            }
        };
        let (generation, reply, stop) = match generation {
            Some((g, text, stop)) => (Some(g), text, stop),
            None => (None, String::new(), None),
        };
        match &error {
            None => self
                .messages
                .push(ChatMessage::new("assistant", reply.clone())),
            Some(message) => {
                self.messages.pop();
                eprintln!("kvcore: {message}");
            }
        }
        if self.args.json {
            let json = serde_json::json!({
                "turn": self.turns,
                "text": reply,
                "tokens": generation.as_ref().map_or(&[][..], |g| &g.tokens[..]),
                "stopped": generation.as_ref().is_some_and(|g| g.stopped()),
                "stop": stop,
                "error": error,
                "stats": generation
                    .as_ref()
                    .map(|g| stats_json(g, self.session.kv(), self.model.activations())),
            });
            let mut out = std::io::stdout().lock();
            writeln!(out, "{json}")?;
            out.flush()?;
        } else if let Some(g) = &generation {
            print_turn_stats(self.turns, g);
        }
        Ok(())
    }

    /// The ids of the conversation rendered for the next reply, or why there are none.
    fn prompt(&self) -> Result<Vec<u32>, String> {
        let ids = chat_ids(self.tok, self.template, &self.messages).map_err(|e| {
            format!("cannot render the conversation ({e:#}); the message was dropped")
        })?;
        if ids.len() > self.max_ctx {
            return Err(format!(
                "the conversation is {} tokens with this message, more than the context of {} positions (--ctx); the message was dropped: /reset starts a new conversation",
                ids.len(),
                self.max_ctx
            ));
        }
        Ok(ids)
    }

    /// Generates the reply to `ids`, streaming it unless `--json`; the reply's text and
    /// the stop string that ended it.
    fn reply(&mut self, ids: &[u32]) -> anyhow::Result<Reply> {
        if self.args.no_reuse {
            self.session.clear();
        }
        let mut decoder = Decoder::new(self.tok, &self.params, ids, self.max_ctx)?;
        if let Some(previous) = &self.sampler {
            decoder.continue_draws(previous);
        }
        let mut printer = Printer::new(!self.args.json);
        let result = model::generate(self.model, &mut self.session, ids, &mut decoder, |step| {
            printer.show(&step.text);
            true
        });
        let (generation, mut failure) = split_result(result);
        if failure.is_some() {
            printer.show(&decoder.release());
        }
        failure = failure.or_else(|| context_full(&decoder, self.args.n, self.max_ctx));
        printer.finish()?;
        self.sampler = Some(decoder.sampler().clone());
        Ok(Reply {
            text: decoder.text().to_string(),
            stop: decoder.stop_string().map(str::to_string),
            generation,
            failure,
        })
    }
}

/// One turn's reply: the generation, the error that ended it, the text shown and the
/// stop string that ended it.
struct Reply {
    generation: Generation,
    failure: Option<ModelError>,
    text: String,
    stop: Option<String>,
}

"""Checks the conversations triad-eval --choices --chat-template asks MMLU's
questions in (its --predictions' "context" of each question) against
lm-evaluation-harness's fewshot_context under --apply_chat_template, for
MMLU's prompt: the task's description ("The following are multiple choice
questions (with answers) about SUBJECT.\\n\\n") as the system message, after
--system_instruction and a blank line; the first SHOTS other questions of
the subject as examples (its first_n sampler), one user turn with the
question or (--multiturn) a user turn and the right letter each; the
question's own user turn; written out in ChatML as the chat fixture's
template writes it, the assistant's turn opened. Exits non-zero naming
the first context that differs.

usage: harness_choice_chats.py QUESTIONS PREDICTIONS SHOTS [--multiturn] [--system TEXT]
"""
import argparse
import json
import sys


def text(doc):
    options = "".join("%s. %s\n" % ("ABCD"[i], c) for i, c in enumerate(doc["choices"]))
    return doc["question"].strip() + "\n" + options + "Answer:"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("questions")
    ap.add_argument("predictions")
    ap.add_argument("shots", type=int)
    ap.add_argument("--multiturn", action="store_true")
    ap.add_argument("--system")
    a = ap.parse_args()
    with open(a.questions) as f:
        docs = [json.loads(line) for line in f if line.strip()]
    with open(a.predictions) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if len(rows) != len(docs):
        sys.exit("%d predictions for %d questions" % (len(rows), len(docs)))
    for index, (doc, row) in enumerate(zip(docs, rows)):
        subject = doc["subject"].replace("_", " ")
        description = ("The following are multiple choice questions (with answers) about %s.\n\n"
                       % subject)
        system = a.system + "\n\n" + description if a.system else description
        examples = [x for k, x in enumerate(docs)
                    if k != index and x["subject"] == doc["subject"]][: a.shots]
        messages = [{"role": "system", "content": system}]
        if a.multiturn:
            for x in examples:
                messages += [{"role": "user", "content": text(x)},
                             {"role": "assistant", "content": "ABCD"[x["answer"]]}]
            messages.append({"role": "user", "content": text(doc)})
        else:
            shown = "".join(text(x) + " " + "ABCD"[x["answer"]] + "\n\n" for x in examples)
            messages.append({"role": "user", "content": shown + text(doc)})
        want = "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"])
                       for m in messages) + "<|im_start|>assistant\n"
        if row.get("context") != want:
            sys.exit("question %d: triad-eval asked %r, the harness %r"
                     % (index, row.get("context"), want))


if __name__ == "__main__":
    main()

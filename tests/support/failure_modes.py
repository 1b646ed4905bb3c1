"""Planted failure modes: low results written from a few distinct ways an agent fails (different
words, different lengths), plus unrelated noise, to measure how failure topics find them."""

from __future__ import annotations

import random

from scoring.topics import LowResult, low_result

# Each mode: (the questions asked, how the answer goes wrong, what the judge said), with slots.
# A mode's answers share the words of its failure (one bug answers alike) and differ elsewhere;
# modes differ in words and in length.
MODES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "refund": (
        ["Can I get my money back for order {n}?", "I want a refund for order {n}, it arrived broken.",
         "Please refund order {n}.", "Order {n} was damaged, what can you do?"],
        ["Refunds are not possible for order {n}: the refund policy forbids any refund after shipping.",
         "I cannot process a refund for order {n}, the refund policy does not allow it.",
         "Sorry, no refund for order {n}; our refund policy is strict about shipped orders."],
        ["Refused a refund the refund policy allows.", "Denied an eligible refund, misquoting the refund policy.",
         "Wrong refund policy: the refund was eligible."],
    ),
    "link": (
        ["Where can I read the warranty terms?", "Is there a page about returns?", "Send me the setup guide.",
         "Do you have documentation for model {n}?"],
        ["See https://help.example.com/docs/{n}/guide - the link has everything.",
         "The link https://help.example.com/docs/{n}/returns explains it.",
         "Here is the link: https://help.example.com/docs/{n}/warranty"],
        ["The link is invented: help.example.com/docs has no such page.",
         "Invented a link to a help page that does not exist.", "The help link is invented."],
    ),
    "language": (
        ["How do I reset my password?", "My package is late, what now?", "Can I change my delivery address?"],
        ["Hola, para restablecer su contrasena vaya a la configuracion de su cuenta y pulse olvidar "
         "contrasena; recibira un correo en unos minutos con las instrucciones {n}.",
         "Hola, lo sentimos mucho, su paquete llegara pronto; puede seguir el envio desde su cuenta, "
         "seccion pedidos, con el numero {n}. Gracias por su paciencia.",
         "Hola, puede cambiar la direccion de entrega en su cuenta, seccion pedidos, antes de que el "
         "paquete salga del almacen {n}; despues ya no es posible."],
        ["Answered in Spanish to a customer who wrote in English.", "Replied in Spanish, not in English.",
         "Spanish reply to an English question."],
    ),
    "tone": (
        ["Why is my order late again?", "This is the third time I ask, where is my parcel?", "Nobody answers me!"],
        ["Stop whining. That is your problem, not mine {n}.",
         "Stop whining, it is your own problem {n}.",
         "Your problem. Stop whining and wait {n}."],
        ["Rude to the customer: told them to stop whining.", "Rude, blamed the customer.",
         "Rude and dismissive reply."],
    ),
}
NOISE = ("weather mild winter museum quarterly numbers team attached gardening tomatoes water chess "
         "opening sicilian recipe bread flour grams train platform noon cat sofa slept violin concert "
         "tickets mountain hiking boots lake fishing paint canvas brushes piano lesson scales coffee beans "
         "roast bicycle tyre pump garden fence wood football match score library books overdue").split()


def low_results(per_mode: int, noise: int, *, modes: list[str] | None = None, seed: int = 7,
                start: int = 0) -> tuple[list[LowResult], dict[str, str]]:
    """Shuffled low results of the named modes (all by default) and noise, and each one's mode
    (by result id; noise is "noise")."""
    rng = random.Random(seed)
    results, truth = [], {}
    n = start
    for mode in modes or list(MODES):
        questions, answers, reasons = MODES[mode]
        for _ in range(per_mode):
            n += 1
            results.append(low_result(f"r-{mode}-{n}", rng.choice(questions).format(n=n),
                                      rng.choice(answers).format(n=n), [rng.choice(reasons)]))
            truth[f"r-{mode}-{n}"] = mode
    for _ in range(noise):
        n += 1
        words = rng.sample(NOISE, 6)  # unrelated: each its own few words
        results.append(low_result(f"r-noise-{n}", " ".join(words[:3]), " ".join(words[3:]), [f"{words[0]} {n}"]))
        truth[f"r-noise-{n}"] = "noise"
    rng.shuffle(results)
    return results, truth

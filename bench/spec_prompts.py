"""Input-grounded requests for speculative decoding: rewrite, edit or summarise a given text or code, so the output
repeats the input (what prompt lookup is for)."""

CODE = '''def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, age, city = line.strip().split(",")
            users.append({"name": name, "age": int(age), "city": city})
    return users


def adults(users):
    return [u for u in users if u["age"] >= 18]


def by_city(users):
    out = {}
    for u in users:
        out.setdefault(u["city"], []).append(u)
    return out
'''

TEXT = ("The museum opens at nine in the morning and closes at six in the evening. Tickets cost twelve euros for "
        "adults and six euros for children under twelve. Guided tours start every hour from the main hall, and the "
        "last tour starts at five. Visitors may take photographs without flash in every room except the east "
        "gallery, where the old manuscripts are kept.")

PROMPTS = [
    f"Rename the function load_users to read_users everywhere in this code and print the whole file:\n\n{CODE}",
    f"Add a docstring to each function of this code and print the whole file:\n\n{CODE}",
    f"Copy this text, replacing 'museum' with 'gallery':\n\n{TEXT}",
    f"Repeat this text word for word, then say how many sentences it has:\n\n{TEXT}",
    f"Rewrite this code with type hints, keeping everything else the same:\n\n{CODE}",
    f"Correct the spelling in this text and print it whole:\n\n{TEXT.replace('euros', 'euross').replace('gallery', 'galery')}",
    f"Print this code unchanged, then explain what by_city returns:\n\n{CODE}",
    f"Summarise this text in its own words, quoting the opening hours exactly:\n\n{TEXT}",
]

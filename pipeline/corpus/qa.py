"""Hand-written questions over the sample corpus, and the synthetic facts of the eval set.

Data only, read by ``pipeline.corpus.build`` and ``pipeline.corpus.eval_records``. Every answer
is short and a literal substring of the document text that ``pipeline.corpus.rst``
produces (the build re-checks this). Questions were written by reading the documents.
"""

from __future__ import annotations

# doc id -> [(question, answer)]: the sample QA job (short documents, 2k-4k tokens).
SAMPLE_QA: dict[str, list[tuple[str, str]]] = {
    "howto-sorting": [
        ("Which sorting algorithm used in Python does the HOWTO name?", "Timsort"),
        ("What is the three-step sorting idiom described in the HOWTO called?",
         "Decorate-Sort-Undecorate"),
        ("Who popularized the Schwartzian transform among Perl programmers?",
         "Randal L. Schwartz"),
    ],
    "tutorial-stdlib": [
        ("Which attribute of the sys module stores the command line arguments as a list?",
         "argv"),
        ("Which module is a wrapper for the SQLite database library?", "sqlite3"),
        ("Together with pstats, which module helps identify time critical sections of code?",
         "profile"),
    ],
    "faq-windows": [
        ("Which virus scanner does the FAQ call a particular offender for slow start-up?",
         "McAfee"),
        ("Which Windows-specific module checks for a keypress without blocking?", "msvcrt"),
        ("Which environment variable must contain .py to run scripts without the extension?",
         "PATHEXT"),
    ],
    "howto-ipaddress": [
        ("Which flag makes a network constructor coerce host bits to zero?", "strict=False"),
        ("What is the hostmask of the network 192.0.2.0/24?", "0.0.0.255"),
        ("Which ValueError subclass reports that the netmask part failed to parse?",
         "NetmaskValueError"),
    ],
    "tutorial-floatingpoint": [
        ("Starting with which version can Python display the shortest repr such as 0.1?",
         "Python 3.1"),
        ("Which function helps mitigate loss of precision during summation?", "math.fsum()"),
        ("Which float method expresses a float in hexadecimal?", "float.hex()"),
    ],
    "tutorial-stdlib2": [
        ("Which Template method leaves placeholders unchanged when data is missing?",
         "safe_substitute()"),
        ("Which module provides a version of repr() for abbreviated displays?", "reprlib"),
        ("Which collections object offers faster appends and pops from the left side?",
         "deque()"),
    ],
    "library-main": [
        ("What is the hypothetical package used to illustrate __main__.py called?",
         "bandclass"),
        ("Which module documents the -m flag to the interpreter in more detail?", "runpy"),
        ("Which standard library package is given as an example of a minimal __main__.py?",
         "venv"),
    ],
    "reference-executionmodel": [
        ("Which exception is raised when a local variable is used before it is bound?",
         "UnboundLocalError"),
        ("What does the example with a free variable resolved at runtime print?", "42"),
        ("Which statement makes names refer to bindings in the nearest enclosing function "
         "scope?", "nonlocal"),
    ],
}

# doc id -> [(question, answer)] answerable only from the original text of an eval document.
NATIVE_QA: dict[str, list[tuple[str, str]]] = {
    "faq-general": [
        ("In which month and year did Guido van Rossum decide to post Python to USENET?",
         "February 1991"),
        ("Besides Google and Yahoo, which company is named as using Python internally?",
         "Lucasfilm Ltd."),
    ],
    "howto-sockets": [
        ("Where were sockets invented, as part of the BSD flavor of Unix?", "Berkeley"),
        ("What is the POSIX flavor of the non-blocking flag called in C?", "O_NDELAY"),
    ],
    "tutorial-errors": [
        ("What would the example print if its except clauses were reversed, with except B "
         "first?", "B, B, B"),
        ("Which exception method adds a string to the exception's notes list?", "add_note"),
    ],
    "tutorial-inputoutput": [
        ("What value is assigned to bugs in the f-string debugging example?", "roaches"),
        ("Which string method pads a numeric string on the left with zeros?", "str.zfill()"),
    ],
    "whatsnew-3-1": [
        ("On what date was Python 3.1 released?", "June 27, 2009"),
        ("Who contributed the tkinter.ttk module?", "Guilherme Polo"),
    ],
    "howto-urllib2": [
        ("Which password manager class lets you give a default username and password for a "
         "URL?", "HTTPPasswordMgrWithDefaultRealm"),
        ("Who reviewed and revised the document?", "John Lee"),
    ],
    "tutorial-modules": [
        ("Under which file name would CPython 3.3 cache the compiled version of spam.py?",
         "__pycache__/spam.cpython-33.pyc"),
        ("Which function of the sound.effects.echo submodule does the last import example "
         "make directly available?", "echofilter"),
    ],
    "howto-argparse": [
        ("Which deprecated module is argparse based on?", "optparse"),
        ("Which ArgumentParser method lets you specify options that conflict with each "
         "other?", "add_mutually_exclusive_group()"),
    ],
}

# Synthetic facts ("needles") for the eval set: (sentence, question, answer). Invented,
# so no model can know them; each answer is distinctive and absent from the corpus.
NEEDLES: list[tuple[str, str, str]] = [
    ("The project codename chosen by the Zurich team was BLUEHERON.",
     "What codename did the Zurich team choose for the project?", "BLUEHERON"),
    ("The backup server in the Lisbon office is named KESTREL-7.",
     "What is the backup server in the Lisbon office named?", "KESTREL-7"),
    ("The annual maintainers' retreat in 2031 will take place in Ushuaia.",
     "Where will the maintainers' retreat in 2031 take place?", "Ushuaia"),
    ("Ingrid Vasquez-Holm was appointed release archivist for the documentation team.",
     "Who was appointed release archivist for the documentation team?", "Ingrid Vasquez-Holm"),
    ("The test farm in Nairobi runs exactly 347 build workers.",
     "How many build workers does the test farm in Nairobi run?", "347"),
    ("The passphrase for the staging cluster is amber lantern forty-two.",
     "What is the passphrase for the staging cluster?", "amber lantern forty-two"),
    ("The internal benchmark suite is nicknamed TORTOISE-PRIME.",
     "What is the internal benchmark suite nicknamed?", "TORTOISE-PRIME"),
    ("The mascot of the Oslo user group is a purple walrus named Fennimore.",
     "What is the name of the Oslo user group's mascot?", "Fennimore"),
    ("The migration to the new issue tracker was completed on 14 March 2029.",
     "On what date was the migration to the new issue tracker completed?", "14 March 2029"),
    ("The Kyoto sprint team measured a median build time of 38.6 seconds.",
     "What median build time did the Kyoto sprint team measure?", "38.6 seconds"),
    ("Rafaela Okonkwo-Lind designed the logo for the Montevideo conference.",
     "Who designed the logo for the Montevideo conference?", "Rafaela Okonkwo-Lind"),
    ("The cooling system in the Reykjavik data hall is supplied by the firm Glacierworks.",
     "Which firm supplies the cooling system in the Reykjavik data hall?", "Glacierworks"),
    ("The long-term support branch of the toolkit is labelled LTS-MARIGOLD.",
     "How is the long-term support branch of the toolkit labelled?", "LTS-MARIGOLD"),
    ("The Toronto office keeps its spare keyboards in locker number 5512.",
     "In which locker does the Toronto office keep its spare keyboards?", "5512"),
    ("The first prize at the Valparaiso hackathon was a brass telescope.",
     "What was the first prize at the Valparaiso hackathon?", "brass telescope"),
    ("The conference dinner in Tallinn served smoked eel with rye bread.",
     "What fish did the conference dinner in Tallinn serve?", "smoked eel"),
    ("The fuzzing campaign codenamed NIGHTJAR found 29 crashes in the parser.",
     "What was the codename of the fuzzing campaign that found crashes in the parser?",
     "NIGHTJAR"),
    ("The Cape Town mirror synchronises with the primary archive every 17 minutes.",
     "How often does the Cape Town mirror synchronise with the primary archive?",
     "every 17 minutes"),
    ("Dmitri Asanova-Reyes chairs the committee on translation glossaries.",
     "Who chairs the committee on translation glossaries?", "Dmitri Asanova-Reyes"),
    ("The support hotline for the Helsinki lab uses the extension 8041.",
     "Which extension does the support hotline for the Helsinki lab use?", "8041"),
    ("The release train of the Bergen team departs on the second Tuesday of every month.",
     "When does the release train of the Bergen team depart?", "second Tuesday"),
    ("The documentation style guide recommends the colour code #3B7A57 for warnings.",
     "Which colour code does the documentation style guide recommend for warnings?",
     "#3B7A57"),
    ("The rooftop garden at the Porto office grows seventeen varieties of basil.",
     "How many varieties of basil does the rooftop garden at the Porto office grow?",
     "seventeen"),
    ("The legacy billing service was finally switched off by engineer Tomasz Quill.",
     "Which engineer switched off the legacy billing service?", "Tomasz Quill"),
    ("The Auckland meetup always opens with a quiz about volcanoes.",
     "What is the quiz that opens the Auckland meetup about?", "volcanoes"),
    ("The encryption keys of the build archive rotate under policy KR-12.",
     "Under which policy do the encryption keys of the build archive rotate?", "KR-12"),
]

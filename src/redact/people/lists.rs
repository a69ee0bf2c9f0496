//! The word lists the gazetteer's rules read (see the module above).

/// Words before a person's name.
#[rustfmt::skip]
pub(super) const PERSON_BEFORE: &[&str] = &[
    "to", "from", "with", "by", "cc", "bcc", "ask", "tell", "told", "met", "meet", "call",
    "called", "email", "emailed", "ping", "thank", "thanks", "and", "if", "whether", "did",
    "does", "that", "when", "for", "sign", "signed", "invite", "invited", "hire", "hired",
    "introduce", "introducing", "congratulate", "remind", "let", "asked", "via",
];

/// Words after a person's name.
#[rustfmt::skip]
pub(super) const PERSON_AFTER: &[&str] = &[
    "will", "is", "was", "has", "had", "said", "says", "asked", "asks", "wrote", "writes",
    "replied", "reported", "approved", "covered", "needs", "wants", "can", "could",
    "should", "would", "and", "who", "did", "does", "mean", "meant", "thinks", "thought",
    "joined", "left", "owns", "sent", "told", "called", "emailed", "agreed", "added",
    "mentioned", "confirmed", "signed", "shared", "suggested", "noted", "presented",
    "presents", "leads", "led", "manages", "managed", "works", "worked", "lives", "lived",
    "moved", "paid", "owes", "booked", "requested", "complained",
];

#[rustfmt::skip]
pub(super) const ORDINARY: &[&str] = &[
    "Will", "May", "Mark", "Grace", "Hope", "Faith", "Joy", "Bill", "Frank", "Rose", "Art",
    "April", "June", "August", "Summer", "Autumn", "Stone", "Green", "Brown", "Gray",
    "Grey", "White", "Black", "General", "Name", "Baby", "Sister", "Queen", "Prince",
    "Princess", "Price", "Golden", "Unique", "Miracle", "Precious", "America", "Florida",
    "Missouri", "Montana", "Royal", "Pink", "Forest", "Ford", "Noble", "River", "Sincere",
    "Chase", "Dawn", "Ivy", "Jade", "Ruby", "Pearl", "Violet", "Amber", "Crystal", "Holly",
    "Heather", "Sky", "Skye", "Star", "Angel", "Rusty", "Sunny", "Sandy", "Misty", "Don",
    "Guy", "Gay", "Rod", "Pat", "Sue", "Max", "Ray", "Bud", "Coy", "Dee", "Toy", "Ward",
    "Reed", "Lane", "Hunter", "Mason", "Baker", "Walker", "Carter", "Parker", "Porter",
    "Cooper", "Turner", "Miller", "Major", "Page", "Marshall", "Sterling", "Grant",
    "Chance", "Destiny", "Harmony", "Heaven", "Easter", "Haven", "Dallas", "Houston",
    "Austin", "Paris", "Sydney", "Florence", "Georgia", "Virginia", "Carolina", "Dakota",
    "Chelsea", "Jordan", "Savannah", "Madison", "Charlotte", "Columbus", "Cleveland",
    "Jackson", "Orlando", "Aurora", "Santa", "Milan", "Trinity", "Camden", "Devon",
    "Cornell", "Stanford", "Tyler", "Eugene", "Raleigh", "Richmond", "Hudson", "Logan",
    "Winston", "Victoria", "Alexandria", "Augusta", "Helena", "Regina", "Adelaide",
    "Lincoln", "Washington", "Berry", "Cash", "Julia", "Ada", "Crystal", "Travis",
    "Jasmine", "Cassandra", "Arch", "Rocky", "Hugo", "Sage", "Dell", "Harley", "Mercedes",
    "Claude", "Alexa", "Siri", "Cortana", "Jasper", "Devin", "Genesis", "Phoenix", "Nova",
    "Luna", "Echo", "Ember", "Karma", "Mercury", "Apollo", "Atlas", "Orion", "Titan",
    "Neptune", "Venus", "Iris", "Olive", "Basil", "Clay", "Dusty", "Golden", "Honey",
    "Candy", "Cherry", "Penny", "Ginger", "Melody", "Story", "Rich", "Earnest", "Constance",
    "Patience", "Prudence", "Charity", "Verity", "Temperance", "Felicity", "Serenity",
    "Liberty", "Justice", "Sincere", "Precious", "Ace", "Blaze", "Storm", "Rain", "Snow",
    "Winter", "Spring", "Fall", "Bishop", "Pope", "Dean", "Judge", "Duke", "Earl", "Baron",
    "King", "Knight", "Squire", "Abbott", "Bell", "Belle", "Jack", "Van", "Von", "Christ",
    "Emerald", "Diamond", "Garnet", "Opal", "Coral", "Beryl", "Jet", "Flint", "Rock", "Mac",
    "America", "Asia", "Bradford", "Brooklyn", "France", "Israel", "Kenya", "London",
    "Mali", "Sierra", "Verona", "Wellington", "Shannon", "Preston", "Chester", "Canada",
    "Australia", "Mexico", "Germany", "Japan", "China", "India", "Brazil", "Spain", "Italy",
    "Russia", "Korea", "Singapore", "Ireland", "Scotland", "Wales", "England", "Britain",
    "Europe", "Africa", "Texas", "California", "Chicago", "Toronto", "Dublin", "Boston",
    "Seattle", "Denver", "Miami", "Atlanta", "Berlin", "Tokyo", "Beijing", "Shanghai",
];

/// Words a name does not run into: what follows a given name in a company, a place, a
/// prize or a product, not in a surname.
#[rustfmt::skip]
pub(super) const ENDS_A_NAME: &[&str] = &[
    "Street", "St", "Road", "Rd", "Avenue", "Ave", "Lane", "Drive", "Boulevard", "Way",
    "Place", "Square", "Court", "Close", "Terrace", "Park", "Hall", "Airport", "Station",
    "Bridge", "Hospital", "Clinic", "School", "College", "University", "Institute",
    "Academy", "Center", "Centre", "Foundation", "Fund", "Trust", "Bank", "Group", "Inc",
    "Ltd", "LLC", "Corp", "Co", "Company", "Holdings", "Partners", "Associates", "Services",
    "Service", "Support", "Team", "Award", "Awards", "Prize", "Medal", "Cup", "Day",
    "County", "City", "Town", "Village", "State", "Valley", "Beach", "Island", "Lake",
    "Mountain", "Hotel", "Restaurant", "Cafe", "Café", "Store", "Shop", "Market", "Mall",
    "Pay", "Card", "Cloud", "Studio", "App", "Labs", "Lab", "Media", "Press", "News", "Act",
    "Law", "Plan", "Program", "Project", "Report", "Building", "Tower", "House", "Museum",
    "Gallery", "Library", "Church", "Cathedral", "Chapel", "Stadium", "Arena", "Theatre",
    "Theater", "Cinema", "Festival", "Conference", "Summit", "Series", "Edition", "Version",
    "Pro", "Max", "Plus", "Mini", "Ultra", "Air", "Home", "Office", "Desk", "Portal",
];

/// Words that make a given name after them a place's: San Francisco, Port Elizabeth.
#[rustfmt::skip]
pub(super) const PLACE_WORDS: &[&str] = &[
    "San", "Santa", "Santo", "São", "St", "Saint", "Los", "Las", "El", "Fort", "Port",
    "Mount", "Lake", "Cape", "New", "Glen", "Palm", "Villa",
];

/// Lower-case words inside a surname: Sophie van der Berg, Luis de la Cruz.
#[rustfmt::skip]
pub(super) const PARTICLES: &[&str] = &[
    "van", "von", "der", "den", "de", "del", "della", "da", "di", "du", "la", "le", "bin",
    "ibn", "al",
];

/// Pairs of pinyin words that are not people (places, dishes, games).
#[rustfmt::skip]
pub(super) const NOT_CHINESE_NAMES: &[&str] = &[
    "Hong Kong", "Yin Yang", "Tai Chi", "Feng Shui", "Kung Fu", "Dim Sum", "Mah Jong",
    "Chow Mein", "Lo Mein", "Bok Choy", "Shang Hai", "Bei Jing", "Xi An", "Wu Han", "Ma On",
    "Tsim Sha", "Sha Tin", "Nan Jing", "Guang Zhou", "Shen Zhen", "Hang Zhou", "Su Zhou",
    "Qing Dao", "Tian Jin", "Chong Qing", "Cheng Du", "Yun Nan", "He Nan", "He Bei",
    "Hu Nan", "Hu Bei", "Shan Dong", "Shan Xi", "Jiang Su", "Zhe Jiang", "An Hui",
    "Fu Jian", "Jiang Xi", "Guang Dong", "Guang Xi", "Hai Nan", "Gui Zhou", "Si Chuan",
    "Gan Su", "Qing Hai", "Ning Xia", "Xin Jiang", "Xi Zang", "Tai Wan", "Ao Men",
    "Ping Pong", "Long Beach", "Sun Life",
];

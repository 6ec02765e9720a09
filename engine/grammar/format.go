package grammar

// stringFormat is a supported "format": the shared rule that writes it (the
// characters of the string, quotes excluded) and the range of its length in
// characters, checked against minLength and maxLength.
type stringFormat struct {
	rule     string
	min, max int
}

// formats are checked as format assertions would check them (RFC 3339
// dates and times, RFC 4122 UUIDs, RFC 5321 addresses), but only a bounded,
// common subset of each is generated: times without leap seconds and with
// at most nine fraction digits, and addresses of at most four dot-separated
// atoms in the local part and two to four labels in the domain.
var formats = map[string]stringFormat{
	"date":      {ruleDate, 10, 10},
	"time":      {ruleTime, 9, 24},
	"date-time": {ruleDateTime, 20, 35},
	"uuid":      {ruleUUID, 36, 36},
	"email":     {ruleEmail, 5, 155},
}

const (
	ruleEmailAtom  = "email-atom"
	ruleEmailLabel = "email-label"
)

func (b *builder) formatBody(kind string) expr {
	switch kind {
	case ruleDate:
		return b.date()
	case ruleLeapYear:
		return leapYear()
	case ruleTime:
		offset := altOf(lit("Z"), seqOf(class(chars("+-")), hour(), lit(":"), sixty()))
		return seqOf(hour(), lit(":"), sixty(), lit(":"), sixty(),
			optOf(seqOf(lit("."), repOf(digit, 1, 9))), offset)
	case ruleDateTime:
		return seqOf(b.rule(ruleDate), lit("T"), b.rule(ruleTime))
	case ruleUUID:
		h := b.rule(ruleHexDigit)
		return seqOf(repOf(h, 8, 8), lit("-"), repOf(h, 4, 4), lit("-"), repOf(h, 4, 4), lit("-"),
			repOf(h, 4, 4), lit("-"), repOf(h, 12, 12))
	case ruleEmail:
		atom := b.rule(ruleEmailAtom)
		label := b.rule(ruleEmailLabel)
		return seqOf(atom, repOf(seqOf(lit("."), atom), 0, 3), lit("@"),
			label, repOf(seqOf(lit("."), label), 1, 3))
	case ruleEmailAtom:
		return repOf(class(span('a', 'z').union(span('A', 'Z')).union(span('0', '9')).union(chars("!#$%&'*+-/=?^_`{|}~"))), 1, 15)
	case ruleEmailLabel:
		alnum := class(span('a', 'z').union(span('A', 'Z')).union(span('0', '9')))
		inner := class(span('a', 'z').union(span('A', 'Z')).union(span('0', '9')).union(chars("-")))
		return seqOf(alnum, optOf(seqOf(repOf(inner, 0, 20), alnum)))
	}
	return nil
}

// date writes only days that exist, February 29th in leap years only.
func (b *builder) date() expr {
	year := repOf(digit, 4, 4)
	upTo28 := altOf(seqOf(lit("0"), digit19), seqOf(lit("1"), digit), seqOf(lit("2"), class(span('0', '8'))))
	upTo29 := altOf(seqOf(lit("0"), digit19), seqOf(class(chars("12")), digit))
	long := altOf(seqOf(lit("0"), class(chars("13578"))), lit("10"), lit("12"))
	short := altOf(seqOf(lit("0"), class(chars("469"))), lit("11"))
	return altOf(
		seqOf(year, lit("-"), long, lit("-"), altOf(upTo29, lit("30"), lit("31"))),
		seqOf(year, lit("-"), short, lit("-"), altOf(upTo29, lit("30"))),
		seqOf(year, lit("-02-"), upTo28),
		seqOf(b.rule(ruleLeapYear), lit("-02-29")))
}

// leapYear is a year divisible by 4 but not by 100, or divisible by 400.
func leapYear() expr {
	even, odd := class(chars("02468")), class(chars("13579"))
	notCentury := altOf(seqOf(even, class(chars("48"))), seqOf(class(chars("2468")), lit("0")), seqOf(odd, class(chars("26"))))
	century := altOf(seqOf(even, class(chars("048"))), seqOf(odd, class(chars("26"))))
	return altOf(seqOf(digit, digit, notCentury), seqOf(century, lit("00")))
}

func hour() expr {
	return altOf(seqOf(class(chars("01")), digit), seqOf(lit("2"), class(span('0', '3'))))
}

func sixty() expr { return seqOf(class(span('0', '5')), digit) }
